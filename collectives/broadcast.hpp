#pragma once
/// Broadcast and striped all-gather inside a rollout instance, chunk by chunk, NCCL-style: every
/// member calls in the same order. Implemented by the host chain (collectives/host) and NCCL
/// (collectives/nccl); regrouping aborts a group and builds a new one for the new epoch.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <system_error>
#include <vector>

#include "runtime/transport.hpp"

namespace ferry {

class actor;

/// One of `stripes` parts of a buffer: equal 256-byte aligned parts, the last ones shorter or
/// empty. Striping splits a chunk this way across an instance's leaders.
struct stripe {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};
inline stripe stripe_of(std::uint64_t bytes, std::uint32_t stripes, std::uint32_t index) {
  constexpr std::uint64_t alignment = 256;
  const std::uint64_t each =
      ((bytes + stripes - 1) / stripes + alignment - 1) / alignment * alignment;
  const std::uint64_t offset = std::min(bytes, each * index);
  return {offset, std::min(each, bytes - offset)};
}

/// A buffer a collective reads or fills: its bytes (host, or device memory when `device >= 0`)
/// and, for transports that write into it, the registered region and offset it lies at.
struct buffer_ref {
  std::span<std::byte> bytes;
  region_desc region;
  std::uint64_t offset = 0;
  int device = -1;
};

/// Owning loop only.
class broadcast_group {
 public:
  using completion = std::function<void(std::error_code)>;
  virtual ~broadcast_group() = default;

  virtual std::uint32_t rank() const = 0;
  virtual std::uint32_t size() const = 0;

  /// Root: sends `data`. Others: receive into `data` (same length on every member).
  /// Completion: `void(std::error_code)`, once, when the bytes are in place here and this member
  /// no longer reads the buffer. Up to `depth` calls may be outstanding.
  virtual void async_broadcast(buffer_ref data, completion done) = 0;

  /// Striping: rank r < `stripes` holds `stripe_of(size, stripes, r)` of `data`; on completion
  /// every member holds every stripe. Same ordering and completion rules as async_broadcast.
  virtual void async_all_gather(buffer_ref data, std::uint32_t stripes, completion done) = 0;

  /// Ends every pending operation; the group is unusable afterwards. An operation still reading
  /// its buffer (a send on the wire) completes once it no longer does; the others complete at
  /// once with `errc::stopped`.
  virtual void abort() = 0;
};

/// Builds an instance's broadcast group for an epoch; every member calls it with the same members
/// (the collective's ranks, in order) and `owner`, the member's actor, sends its messages.
using broadcast_factory = std::function<std::unique_ptr<broadcast_group>(
    actor& owner, const std::vector<address>& members, std::uint32_t epoch)>;

}  // namespace ferry
