#pragma once
/// The plan as one rollout worker sees it: which chunks and segments it hears, which of them its
/// instance does not hear whole (they come to it directly), and where the plan's tensors sit in
/// its own. A regroup replaces it and never changes it, so a fiber or pool task holding one across
/// a suspension keeps a consistent view.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/plan.hpp"
#include "actors/stages.hpp"
#include "actors/tensor.hpp"

namespace ferry {

struct worker_plan {
  std::shared_ptr<const ferry::plan> job;  ///< shared with the process's other members (share_plan)
  std::shared_ptr<const plan_index> index;  ///< of `job`, shared likewise while a member keeps it
  std::shared_ptr<const tensor_placement> placement;  ///< of the plan's tensors in the worker's
  std::vector<std::uint32_t> heard_segments;          ///< the segments this worker holds
  std::uint32_t mine_count = 0;                       ///< chunks this worker hears
  std::vector<bool> mine;                             ///< per chunk: this worker hears it
  std::vector<bool> heard_directly;  ///< per chunk: this worker hears it, its instance not whole
  bool direct = false;  ///< some chunks come to it directly (its instance does not hear them whole)
  /// Fills the above for worker `self` of `inst`, whose tensors are `local`; says what is wrong if
  /// the plan sends it bytes it does not hold.
  std::string derive(const std::shared_ptr<const std::vector<tensor_ref>>& local,
                     const address& self, const instance_plan& inst);
};

/// The ranks of `inst`'s collective: its leaders in stripe order (rank s owns stripe s), then the
/// others.
std::vector<address> collective_ranks(const instance_plan& inst);

}  // namespace ferry
