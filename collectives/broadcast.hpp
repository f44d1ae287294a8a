#pragma once
/// Broadcast inside a rollout instance, chunk by chunk, NCCL-style: every member calls in the
/// same order; rank 0 is the root. Implemented by the host chain (collectives/host) and NCCL
/// (collectives/nccl); regrouping aborts a group and builds a new one for the new epoch.
#include <cstdint>
#include <functional>
#include <span>
#include <system_error>

#include "transport/transport.hpp"

namespace ferry {

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

  /// Ends every pending operation; the group is unusable afterwards. An operation still reading
  /// its buffer (a send on the wire) completes once it no longer does; the others complete at
  /// once with `errc::stopped`.
  virtual void abort() = 0;
};

}  // namespace ferry
