#include "runtime/codec.hpp"

#include <limits>

namespace ferry {
namespace detail {

void pack_header(msgpack::packer<frame_sink>& packer, const envelope_header& head) {
  packer.pack_array(6);
  packer.pack(head.protocol);
  packer.pack(head.kind);
  packer.pack(head.from);
  packer.pack(head.to);
  packer.pack(head.epoch);
}

void finish_prefix(frame& f) {
  const auto n = static_cast<std::uint32_t>(f.size() - frame_prefix_bytes);
  for (int i = 0; i < 4; ++i) f[i] = static_cast<std::byte>(n >> (24 - 8 * i));
}

}  // namespace detail

namespace {

template <class T>
bool read_uint(const msgpack::object& o, T& out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER || o.via.u64 > std::numeric_limits<T>::max()) return false;
  out = static_cast<T>(o.via.u64);
  return true;
}

bool read_address(const msgpack::object& o, address& out) {
  return o.type == msgpack::type::ARRAY && o.via.array.size == 2 && read_uint(o.via.array.ptr[0], out.node) &&
         read_uint(o.via.array.ptr[1], out.actor);
}

}  // namespace

result<std::uint32_t> decode_prefix(std::span<const std::byte> prefix, const codec_limits& limits) {
  if (prefix.size() < frame_prefix_bytes) return fail(errc::truncated_frame);
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < frame_prefix_bytes; ++i) n = (n << 8) | std::to_integer<std::uint32_t>(prefix[i]);
  if (n > limits.max_frame_bytes) return fail(errc::oversize_frame);
  if (n == 0) return fail(errc::malformed_frame);
  return n;
}

result<decoded_message> decode_payload(std::span<const std::byte> payload, const message_registry& registry,
                                       const codec_limits& limits) {
  if (payload.size() > limits.max_frame_bytes) return fail(errc::oversize_frame);
  decoded_message m;
  std::size_t offset = 0;
  try {
    const msgpack::unpack_limit caps(limits.max_array, limits.max_map, limits.max_str, limits.max_bin,
                                     limits.max_bin, limits.max_depth);
    m.handle = msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size(), offset, nullptr,
                               nullptr, caps);
  } catch (const msgpack::insufficient_bytes&) {
    return fail(errc::truncated_frame);
  } catch (const std::exception&) {  // parse errors and every size/depth limit
    return fail(errc::malformed_frame);
  }
  if (offset != payload.size()) return fail(errc::malformed_frame);

  const msgpack::object& root = m.handle.get();
  if (root.type != msgpack::type::ARRAY || root.via.array.size != 6) return fail(errc::malformed_frame);
  const msgpack::object* f = root.via.array.ptr;
  if (!read_uint(f[0], m.head.protocol)) return fail(errc::malformed_frame);
  if (m.head.protocol != protocol_version) return fail(errc::wrong_protocol);
  if (!read_uint(f[1], m.head.kind) || !read_address(f[2], m.head.from) || !read_address(f[3], m.head.to) ||
      !read_uint(f[4], m.head.epoch)) {
    return fail(errc::malformed_frame);
  }
  const auto* entry = registry.find(m.head.kind);
  if (!entry) return fail(errc::unknown_kind);
  m.body = f[5];
  if (m.body.type != msgpack::type::MAP || !entry->accepts(m.body)) return fail(errc::malformed_body);
  return m;
}

result<decoded_message> decode_frame(std::span<const std::byte> bytes, const message_registry& registry,
                                     const codec_limits& limits) {
  auto n = decode_prefix(bytes, limits);
  if (!n) return fail(n.error());
  const auto payload = bytes.subspan(frame_prefix_bytes);
  if (payload.size() < *n) return fail(errc::truncated_frame);
  if (payload.size() > *n) return fail(errc::malformed_frame);
  return decode_payload(payload, registry, limits);
}

}  // namespace ferry
