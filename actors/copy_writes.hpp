#pragma once
/// A version that a trainer shard's owner writes into the shard's host copy itself (a written
/// publish) instead of the shard copying it from the registered tensors: where each tensor's
/// bytes go, and which chunks each write completes, so that a chunk leaves as soon as it is whole
/// and every byte is copied once. Made on the shard's loop; then used by the writing thread alone.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "actors/plan.hpp"
#include "actors/stages.hpp"

namespace ferry {

class copy_writes {
 public:
  /// `copy`: the version's host copy, which `job` packs with the chunks `chunks` of the shard
  /// whose `tensors` tensors `placement` places.
  copy_writes(const plan& job, const tensor_placement& placement,
              std::span<const std::uint32_t> chunks, std::span<std::byte> copy,
              std::size_t tensors);

  /// Copies the bytes of the shard's tensor `index` (its place in the shard's table) from `data`
  /// into the copy; returns the chunks this write made whole, or nothing (no byte copied) when
  /// the tensor was written already.
  std::optional<std::vector<std::uint32_t>> write(std::size_t index, const std::byte* data);

 private:
  struct piece {
    std::uint32_t chunk = 0;
    std::uint64_t tensor_offset = 0;
    std::uint64_t copy_offset = 0;
    std::uint64_t bytes = 0;
  };
  std::span<std::byte> copy_;
  std::vector<std::vector<piece>> pieces_;  ///< per tensor of the shard
  std::vector<std::uint32_t> pieces_left_;  ///< per plan chunk: its pieces not yet written
  std::vector<bool> written_;               ///< per tensor of the shard
};

}  // namespace ferry
