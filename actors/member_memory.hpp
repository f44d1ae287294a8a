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

/// What a rollout worker is in a plan, as far as its staging goes.
struct worker_role {
  bool leader = false;
  std::uint32_t stripes = 1;    ///< its instance's leaders
  bool on_device = false;       ///< its tensors are on a GPU
  bool rdma = false;            ///< the transport writes into its GPU (GPUDirect RDMA)
  bool hears_directly = false;  ///< it hears chunks its instance does not hear whole
};

/// A rollout worker's receive slots for one plan, in one region: the slots below `first_direct`
/// of `slot_bytes` each, then the direct ones of the plan's chunk size; and its broadcast slots.
struct worker_slots {
  /// Receive slots before the direct ones: a leader's `depth` per trainer shard, a host
  /// follower's broadcast slots (a follower on a GPU has its broadcast slots there).
  std::uint32_t first_direct = 0;
  /// Bytes of each of those: a chunk's, or where one of several leaders on a GPU copies its
  /// stripe into a broadcast slot, just the largest stripe (at the slot's start: `stripe_only`).
  std::uint64_t slot_bytes = 0;
  /// Slots granted to any trainer for chunks the worker's instance does not hear whole.
  std::uint32_t direct = 0;
  std::uint32_t broadcast = 0;     ///< on the GPU, of a chunk each
  bool receive_on_device = false;  ///< trainers write into the GPU (GPUDirect RDMA)

  std::uint32_t receive() const { return first_direct + direct; }
  std::uint64_t receive_bytes(std::uint64_t chunk_bytes) const {
    return first_direct * slot_bytes + std::uint64_t{direct} * chunk_bytes;
  }

  static worker_slots of(const plan& job, const worker_role& role);
  /// Direct slots per worker that has any: enough to keep every trainer's writes going.
  static std::uint32_t direct_count(std::uint32_t depth) { return 4 * depth; }
  /// Where receive slot `slot` starts in a region laid out as above.
  static std::uint64_t offset_of(std::uint32_t slot, std::uint32_t first_direct,
                                 std::uint64_t slot_bytes, std::uint64_t chunk_bytes) {
    if (slot < first_direct) return slot * slot_bytes;
    return first_direct * slot_bytes + std::uint64_t{slot - first_direct} * chunk_bytes;
  }
  /// Whether slots of `slot_bytes` hold a stripe at their start rather than the chunk's layout.
  static bool stripe_only(std::uint64_t slot_bytes, std::uint64_t chunk_bytes) {
    return slot_bytes < chunk_bytes;
  }
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
job_memory memory_of(
    const plan& job,
    const std::function<void(const address& member, const member_memory&)>& each = {});

}  // namespace ferry
