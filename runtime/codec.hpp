#pragma once
/// Frames: a 4-byte big-endian length, then one msgpack envelope
/// `[protocol, kind, [from.node, from.actor], [to.node, to.actor], epoch, body-map]`.
/// Decoding is strict; see docs/wire-format.md.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/message.hpp"
#include "runtime/message_registry.hpp"

namespace ferry {

using frame = std::vector<std::byte>;
inline constexpr std::size_t frame_prefix_bytes = 4;

/// Caps applied while decoding; anything above is rejected before it is allocated.
struct codec_limits {
  std::uint32_t max_frame_bytes = 16u << 20;
  std::size_t max_depth = 16;
  std::size_t max_array = 1u << 16;
  std::size_t max_map = 1u << 12;
  std::size_t max_str = 1u << 20;
  std::size_t max_bin = 16u << 20;
};

/// A decoded, validated message; owns the memory its body points into.
struct decoded_message {
  envelope_header head;
  msgpack::object_handle handle;
  msgpack::object body;

  /// The body as `M`; the registry already checked that it converts.
  template <message M>
  M as() const {
    return body.as<M>();
  }
};

namespace detail {
/// Appends msgpack output to a frame.
struct frame_sink {
  frame& out;
  void write(const char* data, std::size_t n) {
    const auto* p = reinterpret_cast<const std::byte*>(data);
    out.insert(out.end(), p, p + n);
  }
};
void pack_header(msgpack::packer<frame_sink>& packer, const envelope_header& head);
void finish_prefix(frame& f);
}  // namespace detail

/// Encodes `body` under `head` (whose kind is set from `M`) into a length-prefixed frame.
template <message M>
frame encode(envelope_header head, const M& body) {
  head.kind = M::kind;
  frame f(frame_prefix_bytes);
  detail::frame_sink sink{f};
  msgpack::packer<detail::frame_sink> packer(sink);
  detail::pack_header(packer, head);
  packer.pack(body);
  detail::finish_prefix(f);
  return f;
}

/// Reads a length prefix; `oversize_frame` if it announces more than the cap, `truncated_frame`
/// if fewer than 4 bytes are given.
result<std::uint32_t> decode_prefix(std::span<const std::byte> prefix, const codec_limits& limits);

/// Decodes one envelope payload (without its prefix) and checks its body against `registry`.
result<decoded_message> decode_payload(std::span<const std::byte> payload, const message_registry& registry,
                                       const codec_limits& limits);

/// Decodes one whole frame (prefix + payload); trailing bytes are `malformed_frame`.
result<decoded_message> decode_frame(std::span<const std::byte> bytes, const message_registry& registry,
                                     const codec_limits& limits);

}  // namespace ferry
