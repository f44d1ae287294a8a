#pragma once
/// Errors of the transports.
#include <system_error>

namespace ferry {

enum class transport_errc : int {
  unknown_region = 1,  ///< the peer never registered that region (or deregistered it)
  key_mismatch,        ///< the protection key does not match the region's
  out_of_bounds,       ///< offset + length runs past the region's end
  not_registered,      ///< the local source is not inside a registered region
  peer_unreachable,    ///< no link to that node could be made
  connection_lost,
  protocol_violation,  ///< the peer broke the link protocol and was dropped
  bad_address,         ///< an address string that does not parse
  provider_error,      ///< the underlying library failed; details in the log
  unauthenticated,     ///< the peer did not prove it holds the job secret
  limit_exceeded,      ///< a configured per-peer limit was hit
  copy_not_permitted,  ///< same-host copy: the kernel does not let the receiver read the writer
  copy_failed,         ///< same-host copy: writer gone, or its bytes unreadable
  peer_stalled,        ///< the peer took nothing we sent for longer than the transport waits
  not_same_host,       ///< on the wire only: the writer learns `errc::not_same_host`
};

const std::error_category& transport_category() noexcept;
inline std::error_code make_error_code(transport_errc e) noexcept {
  return {static_cast<int>(e), transport_category()};
}

}  // namespace ferry

template <>
struct std::is_error_code_enum<ferry::transport_errc> : std::true_type {};
