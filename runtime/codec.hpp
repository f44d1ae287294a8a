#pragma once
/// Frames: a 4-byte big-endian length, then one msgpack envelope
/// `[protocol, kind, [from.node, from.actor], [to.node, to.actor], epoch, body-map]`.
/// Decoding is strict; see docs/wire-format.md.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/message.hpp"
#include "runtime/message_registry.hpp"
#include "runtime/shared_vector.hpp"

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

/// A decoded, validated message: its body converted to the kind's struct once, when the frame was
/// checked, and shared by whoever holds the message.
struct decoded_message {
  envelope_header head;
  std::shared_ptr<const void> body;

  /// The body as `M`, which must be the struct of `head.kind`.
  template <message M>
  const M& as() const {
    if (head.kind != M::kind || !body)
      throw std::logic_error("decoded_message::as: not a message of this kind");
    return *static_cast<const M*>(body.get());
  }
};

/// A message handed to a node of the same process as the object it is, never encoded: what a
/// simulation's messages are (their bytes are not what it models). `frame_bytes` is the size its
/// frame would have, for a transport that models the wire.
struct handed_message {
  decoded_message message;
  std::uint64_t frame_bytes = 0;
};

namespace detail {
/// Where messages are packed: msgpack output appended inline. msgpack-c's sbuffer takes a call
/// for each of a message's many writes of a few bytes, and appending them to a frame's vector
/// cost more than the packing; a frame is made from this in one copy.
class pack_buffer {
 public:
  void write(const char* data, std::size_t n) {
    if (n > capacity_ - size_) grow(n);
    std::memcpy(storage_.get() + size_, data, n);
    size_ += n;
  }
  std::span<const std::byte> bytes() const {
    return std::as_bytes(std::span(storage_.get(), size_));
  }
  std::size_t capacity() const { return capacity_; }
  void clear() { size_ = 0; }

 private:
  void grow(std::size_t n);
  std::unique_ptr<char[]> storage_;  // not zeroed: a registration of 100k tensors packs 10 MB
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

template <class Buffer>
void pack_header(msgpack::packer<Buffer>& packer, const envelope_header& head) {
  packer.pack_array(6);
  packer.pack(head.protocol);
  packer.pack(head.kind);
  packer.pack(head.from);
  packer.pack(head.to);
  packer.pack(head.epoch);
}
/// Counts what a packer writes: a frame's size without making its bytes.
struct size_counter {
  std::size_t bytes = 0;
  std::size_t shared_bytes = 0;  ///< of `bytes`, shared_vectors' contents
  void write(const char* data, std::size_t n) {
    bytes += n;
    if (data == &shared_contents_mark) shared_bytes += n;
  }
};

/// Writes the length prefix of a frame whose payload follows its first 4 bytes.
void finish_prefix(frame& f);
/// This thread's buffer to pack a message into, empty.
pack_buffer& packing_buffer();
/// A frame of `packed`, then `more`.
frame framed(std::span<const std::byte> packed, std::span<const std::byte> more = {});
}  // namespace detail

/// Encodes `body` under `head` (whose kind is set from `M`) into a length-prefixed frame.
template <message M>
frame encode(envelope_header head, const M& body) {
  head.kind = M::kind;
  auto& buffer = detail::packing_buffer();
  msgpack::packer<detail::pack_buffer> packer(buffer);
  detail::pack_header(packer, head);
  packer.pack(body);
  return detail::framed(buffer.bytes());
}

/// A message sent on its own this large goes as a frame even where a transport hands messages
/// over: a table of 140k tensors packs to a fraction of its object's memory, and hundreds of
/// messages wait to cross a simulated network at once. What is shared is not counted: a body
/// encoded once for many is one object for all, and so are the contents of a `shared_vector`.
inline constexpr std::size_t max_handed_over_bytes = 1u << 20;

/// Whether a decoder accepts `body` as far as its own check goes: a message failing its `valid()`
/// is never handed over as an object, but sent as a frame to be rejected as any other.
template <message M>
bool passes_own_check(const M& body) {
  if constexpr (requires { body.valid(); }) return body.valid();
  return true;
}

/// The size of a frame, counted without making it.
struct frame_extent {
  std::size_t bytes = 0;
  /// Of `bytes`, those one object holds for every message that carries them: the contents of
  /// `shared_vector` fields, or a body encoded once for many.
  std::size_t shared_bytes = 0;
};

/// The size of the frame `encode(head, body)` makes, counted without making it.
template <message M>
frame_extent frame_size(envelope_header head, const M& body) {
  head.kind = M::kind;
  detail::size_counter counter;
  msgpack::packer<detail::size_counter> packer(counter);
  detail::pack_header(packer, head);
  packer.pack(body);
  return {.bytes = frame_prefix_bytes + counter.bytes, .shared_bytes = counter.shared_bytes};
}

/// A body encoded once for many recipients (the plan, sent to every member), and the body itself
/// for those a transport hands it to as an object.
struct encoded_body {
  msg_kind kind = 0;
  std::vector<std::byte> bytes;
  std::shared_ptr<const void> object;
};

template <message M>
encoded_body encode_body(M body) {
  auto& buffer = detail::packing_buffer();
  msgpack::packer<detail::pack_buffer> packer(buffer);
  packer.pack(body);
  return {.kind = M::kind,
          .bytes = {buffer.bytes().begin(), buffer.bytes().end()},
          .object = passes_own_check(body) ? std::make_shared<const M>(std::move(body)) : nullptr};
}

/// A frame of an already encoded body under `head` (whose kind is set from the body).
frame encode(envelope_header head, const encoded_body& body);
/// The size of the frame `encode(head, body)` makes, counted without making it.
frame_extent frame_size(envelope_header head, const encoded_body& body);

/// Reads a length prefix; `oversize_frame` if it announces more than the cap, `truncated_frame`
/// if fewer than 4 bytes are given.
result<std::uint32_t> decode_prefix(std::span<const std::byte> prefix, const codec_limits& limits);

/// Decodes one envelope payload (without its prefix) and checks its body against `registry`.
result<decoded_message> decode_payload(std::span<const std::byte> payload,
                                       const message_registry& registry,
                                       const codec_limits& limits);

namespace detail {
/// `decode_payload` through msgpack-c's object tree alone: what decode_payload does with any
/// payload its one-pass reader does not take, and what the tests compare that reader with.
result<decoded_message> decode_through_msgpack_c(std::span<const std::byte> payload,
                                                 const message_registry& registry,
                                                 const codec_limits& limits);
}  // namespace detail

/// Decodes one whole frame (prefix + payload); trailing bytes are `malformed_frame`.
result<decoded_message> decode_frame(std::span<const std::byte> bytes,
                                     const message_registry& registry, const codec_limits& limits);

}  // namespace ferry
