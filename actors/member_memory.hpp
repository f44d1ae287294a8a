#pragma once
/// What each member of a plan holds in host and device memory: its tensors, a trainer shard's
/// copies, a worker's staging slots. Members size their staging from it; a job checks the sum
/// against the host before it starts, and a simulation reports it per role.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "actors/plan.hpp"
#include "runtime/environment.hpp"

namespace ferry {

/// Bytes one member holds, by where they lie.
struct member_memory {
  std::uint64_t host = 0;
  std::uint64_t device = 0;  ///< on its GPU
  member_memory& operator+=(const member_memory& o) {
    host += o.host;
    device += o.device;
    return *this;
  }
};

/// A rollout worker's staging slots for one plan, each of the plan's chunk size.
struct worker_slots {
  /// Receive slots before the direct ones: a leader's `depth` per trainer shard, a host
  /// follower's broadcast slots (a follower on a GPU has its broadcast slots there).
  std::uint32_t first_direct = 0;
  /// Slots granted to any trainer for chunks the worker's instance does not hear whole.
  std::uint32_t direct = 0;
  std::uint32_t broadcast = 0;  ///< on the GPU
  bool receive_on_device = false;  ///< trainers write into the GPU (GPUDirect RDMA)
  std::uint32_t receive() const { return first_direct + direct; }

  /// The slots of a worker that leads or follows, holds its tensors on a GPU or in host memory
  /// (`on_device`), is reached there by the transport (`rdma`), and hears chunks directly or not.
  static worker_slots of(const plan& job, bool leader, bool on_device, bool rdma, bool hears_directly);
  /// Direct slots per worker that has any: enough to keep every trainer's writes going.
  static std::uint32_t direct_count(std::uint32_t depth) { return 4 * depth; }
};

/// What trainer shard `shard` holds: its tensors and the copies the plan has it keep.
member_memory shard_memory(const plan& job, std::uint32_t shard);
/// What worker `rank` of `inst` holds: the bytes it receives, and its staging.
member_memory worker_memory(const plan& job, const instance_plan& inst, std::size_t rank);

/// Why `bytes` of host memory for `what` do not fit in what `host` has available; nothing when
/// they do or it does not say.
std::optional<std::string> beyond_host(platform& host, std::uint64_t bytes, std::string_view what);

/// Per role, the most one member holds, and every member's sum.
struct job_memory {
  member_memory trainer, leader, follower, all;
};
/// What the members of `job` hold; `each` (when given) sees every member's.
job_memory memory_of(const plan& job,
                     const std::function<void(const address& member, const member_memory&)>& each = {});

}  // namespace ferry
