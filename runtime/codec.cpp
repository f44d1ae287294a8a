#include "runtime/codec.hpp"

#include <cstring>
#include <limits>

namespace ferry {
namespace detail {

void finish_prefix(frame& f) {
  const auto n = static_cast<std::uint32_t>(f.size() - frame_prefix_bytes);
  for (int i = 0; i < 4; ++i) f[i] = static_cast<std::byte>(n >> (24 - 8 * i));
}

void pack_buffer::grow(std::size_t n) {
  capacity_ = std::max({2 * capacity_, size_ + n, std::size_t{256}});
  auto larger = std::make_unique_for_overwrite<char[]>(capacity_);
  if (size_ > 0) std::memcpy(larger.get(), storage_.get(), size_);
  storage_ = std::move(larger);
}

pack_buffer& packing_buffer() {
  thread_local pack_buffer buffer;
  // Kept for the next message. One that a large message (a registration of 100k tensors) grew is
  // kept while messages that large come, and let go after the first small one.
  if (buffer.capacity() > (1u << 20) && buffer.bytes().size() < buffer.capacity() / 4)
    buffer = pack_buffer();
  buffer.clear();
  return buffer;
}

frame framed(std::span<const std::byte> packed, std::span<const std::byte> more) {
  // Appended, not sized first: zeroing the bytes before copying them cost as much as the copy.
  frame f;
  f.reserve(frame_prefix_bytes + packed.size() + more.size());
  f.resize(frame_prefix_bytes);
  f.insert(f.end(), packed.begin(), packed.end());
  f.insert(f.end(), more.begin(), more.end());
  finish_prefix(f);
  return f;
}

}  // namespace detail

frame encode(envelope_header head, const encoded_body& body) {
  head.kind = body.kind;
  auto& buffer = detail::packing_buffer();
  msgpack::packer<detail::pack_buffer> packer(buffer);
  detail::pack_header(packer, head);
  return detail::framed(buffer.bytes(), body.bytes);
}

frame_extent frame_size(envelope_header head, const encoded_body& body) {
  head.kind = body.kind;
  detail::size_counter counter;
  msgpack::packer<detail::size_counter> packer(counter);
  detail::pack_header(packer, head);
  return {.bytes = frame_prefix_bytes + counter.bytes + body.bytes.size(),
          .shared_bytes = body.bytes.size()};
}

namespace {

template <class T>
bool read_uint(const msgpack::object& o, T& out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER || o.via.u64 > std::numeric_limits<T>::max())
    return false;
  out = static_cast<T>(o.via.u64);
  return true;
}

bool read_address(const msgpack::object& o, address& out) {
  return o.type == msgpack::type::ARRAY && o.via.array.size == 2 &&
         read_uint(o.via.array.ptr[0], out.node) && read_uint(o.via.array.ptr[1], out.actor);
}

/// The envelope's first five fields: protocol, kind, from, to, epoch.
std::error_code read_header(const msgpack::object* f, envelope_header& head) {
  if (!read_uint(f[0], head.protocol)) return errc::malformed_frame;
  if (head.protocol != protocol_version) return errc::wrong_protocol;
  if (!read_uint(f[1], head.kind) || !read_address(f[2], head.from) ||
      !read_address(f[3], head.to) || !read_uint(f[4], head.epoch)) {
    return errc::malformed_frame;
  }
  return {};
}

/// The same, from the bytes.
std::error_code read_header(detail::wire_reader& in, envelope_header& head) {
  auto address_of = [&](address& out) {
    if (!in.at_array() || in.enter_array() != 2 || !in.read_unsigned(out.node) ||
        !in.read_unsigned(out.actor))
      return false;
    in.leave();
    return true;
  };
  if (!in.read_unsigned(head.protocol)) return errc::malformed_frame;
  if (head.protocol != protocol_version) return errc::wrong_protocol;
  if (!in.read_unsigned(head.kind) || !address_of(head.from) || !address_of(head.to) ||
      !in.read_unsigned(head.epoch))
    return errc::malformed_frame;
  return {};
}

/// Strings and binaries are read where they lie in the payload, not copied into the zone: the
/// body is converted to its struct before the payload goes.
bool in_place(msgpack::type::object_type, std::size_t, void*) {
  return true;
}

/// This thread's zone for decoding a frame, emptied after it but for its first chunk (a zone of
/// each frame's own would take 8 KiB from the heap for every message).
struct frame_zone {
  frame_zone() : zone(thread_zone()) {}
  ~frame_zone() { zone.clear(); }
  static msgpack::zone& thread_zone() {
    thread_local msgpack::zone z;
    return z;
  }
  msgpack::zone& zone;
};

msgpack::unpack_limit caps_of(const codec_limits& limits, std::size_t depth) {
  return {limits.max_array, limits.max_map, limits.max_str, limits.max_bin, limits.max_bin, depth};
}

}  // namespace

result<std::uint32_t> decode_prefix(std::span<const std::byte> prefix, const codec_limits& limits) {
  if (prefix.size() < frame_prefix_bytes) return fail(errc::truncated_frame);
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < frame_prefix_bytes; ++i)
    n = (n << 8) | std::to_integer<std::uint32_t>(prefix[i]);
  if (n > limits.max_frame_bytes) return fail(errc::oversize_frame);
  if (n == 0) return fail(errc::malformed_frame);
  return n;
}

result<decoded_message> decode_payload(std::span<const std::byte> payload,
                                       const message_registry& registry,
                                       const codec_limits& limits) {
  if (payload.size() > limits.max_frame_bytes) return fail(errc::oversize_frame);
  // A good frame is read in one pass; msgpack-c's decoder says what is wrong with any other.
  const auto caps = caps_of(limits, limits.max_depth);
  try {
    const frame_zone z;
    detail::wire_reader in(payload, z.zone, caps);
    decoded_message m;
    if (in.at_array() && in.enter_array() == 6 && !read_header(in, m.head)) {
      const auto* entry = registry.find(m.head.kind);
      if (entry && in.at_map() && (m.body = entry->read(in)) && in.at_end()) return m;
    }
  } catch (const std::exception&) {
  }
  return detail::decode_through_msgpack_c(payload, registry, limits);
}

result<decoded_message> detail::decode_through_msgpack_c(std::span<const std::byte> payload,
                                                         const message_registry& registry,
                                                         const codec_limits& limits) {
  if (payload.size() > limits.max_frame_bytes) return fail(errc::oversize_frame);
  const frame_zone z;
  msgpack::object root;
  std::size_t offset = 0;
  try {
    root = msgpack::unpack(z.zone, reinterpret_cast<const char*>(payload.data()), payload.size(),
                           offset, in_place, nullptr, caps_of(limits, limits.max_depth));
  } catch (const msgpack::insufficient_bytes&) {
    return fail(errc::truncated_frame);
  } catch (const std::exception&) {  // parse errors and every size/depth limit
    return fail(errc::malformed_frame);
  }
  if (offset != payload.size()) return fail(errc::malformed_frame);

  if (root.type != msgpack::type::ARRAY || root.via.array.size != 6)
    return fail(errc::malformed_frame);
  const msgpack::object* f = root.via.array.ptr;
  decoded_message m;
  if (auto ec = read_header(f, m.head)) return fail(ec);
  const auto* entry = registry.find(m.head.kind);
  if (!entry) return fail(errc::unknown_kind);
  if (f[5].type != msgpack::type::MAP || !(m.body = entry->convert(f[5])))
    return fail(errc::malformed_body);
  return m;
}

result<decoded_message> decode_frame(std::span<const std::byte> bytes,
                                     const message_registry& registry, const codec_limits& limits) {
  auto n = decode_prefix(bytes, limits);
  if (!n) return fail(n.error());
  const auto payload = bytes.subspan(frame_prefix_bytes);
  if (payload.size() < *n) return fail(errc::truncated_frame);
  if (payload.size() > *n) return fail(errc::malformed_frame);
  return decode_payload(payload, registry, limits);
}

}  // namespace ferry
