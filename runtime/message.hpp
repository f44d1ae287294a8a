#pragma once
/// Addresses, message kinds and the envelope every message travels in.
#include <cstdint>
#include <msgpack.hpp>

#include "runtime/define_map.hpp"

namespace ferry {

using node_id = std::uint32_t;
using actor_id = std::uint32_t;
/// Stable wire id of a message kind; never reused. Ranges: runtime 1-15, actors 16-127,
/// collectives 128-191, transports and handshakes 192-255.
using msg_kind = std::uint16_t;

/// The wire protocol version carried by every envelope.
inline constexpr std::uint16_t protocol_version = 3;

struct address {
  node_id node = 0;
  actor_id actor = 0;
  friend bool operator==(const address&, const address&) = default;
  friend auto operator<=>(const address&, const address&) = default;
  FERRY_DEFINE_ARRAY(node, actor)
};

/// Everything of an envelope but its body: `{protocol, kind, from, to, epoch, body}`.
struct envelope_header {
  std::uint16_t protocol = protocol_version;
  msg_kind kind = 0;
  address from;
  address to;
  std::uint32_t epoch = 0;
};

/// A message requires `static constexpr msg_kind kind` and FERRY_DEFINE_MAP of its fields.
template <class M>
concept message = requires {
  { M::kind } -> std::convertible_to<msg_kind>;
};

}  // namespace ferry
