#pragma once
/// Errors of the runtime: framing, decoding, routing and the event loop.
#include <cstdint>
#include <expected>
#include <system_error>

namespace ferry {

enum class errc : int {
  truncated_frame = 1,  ///< fewer bytes than the length prefix announces
  oversize_frame,       ///< length prefix above the configured cap
  malformed_frame,      ///< not a msgpack envelope of the expected shape
  wrong_protocol,       ///< envelope protocol version is not ours
  unknown_kind,         ///< no message of that kind is registered
  malformed_body,       ///< body does not decode as the kind's struct
  unknown_actor,        ///< no actor with that address lives on this node
  unknown_peer,         ///< no route to that node
  // 9 was stale_epoch, never raised: actors judge epochs themselves. Values stay as they were.
  stopped = 10,  ///< the loop or the peer is shut down
  timed_out,
  invalid_argument,
  forged_sender,  ///< envelope sender is not the node the frame came from
  not_same_host,  ///< a same-host path (cma, shared host copies) to a peer on another host
};

const std::error_category& runtime_category() noexcept;
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), runtime_category()};
}

template <class T>
using result = std::expected<T, std::error_code>;

/// `std::unexpected(make_error_code(e))`, spelled short.
inline std::unexpected<std::error_code> fail(std::error_code ec) {
  return std::unexpected(ec);
}

}  // namespace ferry

template <>
struct std::is_error_code_enum<ferry::errc> : std::true_type {};
