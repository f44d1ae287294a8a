#include "transport/tcp/link_protocol.hpp"

#include <algorithm>
#include <string>

namespace ferry::tcp_link {
namespace {

/// Appends big-endian integers and byte arrays to a frame.
struct writer {
  std::vector<std::byte> out;
  writer(frame_type type, std::size_t body_bytes) {
    out.reserve(head_bytes + body_bytes);
    const auto head = make_head(type, body_bytes);
    out.assign(head.begin(), head.end());
  }
  template <class T>
  writer& be(T v) {
    for (int i = sizeof(T) - 1; i >= 0; --i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
    return *this;
  }
  template <std::size_t N>
  writer& bytes(const std::array<std::byte, N>& a) {
    out.insert(out.end(), a.begin(), a.end());
    return *this;
  }
};

/// Reads big-endian integers and byte arrays from a body of a checked size.
struct reader {
  std::span<const std::byte> in;
  template <class T>
  T be() {
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      v = static_cast<T>((v << 8) | std::to_integer<T>(in[i]));
    in = in.subspan(sizeof(T));
    return v;
  }
  template <std::size_t N>
  std::array<std::byte, N> bytes() {
    std::array<std::byte, N> a;
    std::copy_n(in.begin(), N, a.begin());
    in = in.subspan(N);
    return a;
  }
  /// Magic and version; false if either is not ours.
  bool preamble() { return bytes<4>() == magic && be<std::uint16_t>() == link_version; }
};

std::optional<auth_mode> read_auth(reader& r) {
  const auto v = r.be<std::uint8_t>();
  if (v > static_cast<std::uint8_t>(auth_mode::hmac_sha256)) return std::nullopt;
  return static_cast<auth_mode>(v);
}

void put_write(writer& w, const write_header& h) {
  w.be(h.region).be(h.key).be(h.offset).be(h.length).be(h.imm).be(h.id);
}

write_header read_write(reader& r) {
  write_header h;
  h.region = r.be<std::uint64_t>();
  h.key = r.be<std::uint64_t>();
  h.offset = r.be<std::uint64_t>();
  h.length = r.be<std::uint64_t>();
  h.imm = r.be<std::uint32_t>();
  h.id = r.be<std::uint64_t>();
  return h;
}

}  // namespace

std::array<std::byte, head_bytes> make_head(frame_type type, std::size_t body_bytes) {
  const auto n = static_cast<std::uint32_t>(body_bytes + 1);
  return {static_cast<std::byte>(n >> 24), static_cast<std::byte>(n >> 16),
          static_cast<std::byte>(n >> 8), static_cast<std::byte>(n), static_cast<std::byte>(type)};
}

std::optional<head_fields> parse_head(std::span<const std::byte, head_bytes> head) {
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | std::to_integer<std::uint32_t>(head[i]);
  if (n == 0) return std::nullopt;
  return head_fields{n, std::to_integer<std::uint8_t>(head[4])};
}

std::vector<std::byte> encode(const hello& h) {
  writer w(frame_type::hello, hello_bytes);
  w.bytes(magic)
      .be(link_version)
      .be(static_cast<std::uint8_t>(h.auth))
      .be(h.from)
      .be(h.to)
      .bytes(h.nonce);
  return std::move(w.out);
}

std::vector<std::byte> encode(const challenge& c) {
  writer w(frame_type::challenge, challenge_bytes);
  w.bytes(magic)
      .be(link_version)
      .be(static_cast<std::uint8_t>(c.auth))
      .be(c.from)
      .bytes(c.nonce)
      .bytes(c.proof);
  return std::move(w.out);
}

std::vector<std::byte> encode_proof(const link_proof& p) {
  return std::move(writer(frame_type::proof, proof_bytes).bytes(p).out);
}
std::vector<std::byte> encode_accept() {
  return std::move(writer(frame_type::accept, 0).out);
}
std::vector<std::byte> encode_refuse(std::uint16_t reason) {
  return std::move(writer(frame_type::refuse, refuse_bytes).be(reason).out);
}

std::vector<std::byte> encode(const write_header& h) {
  writer w(frame_type::write, write_header_bytes);
  put_write(w, h);
  return std::move(w.out);
}

std::vector<std::byte> encode(const local_write_header& h) {
  writer w(frame_type::local_write, local_write_bytes);
  put_write(w, h.write);
  w.be(h.pid).be(h.source).be(h.host);
  return std::move(w.out);
}

std::vector<std::byte> encode(const write_ack& a) {
  return std::move(writer(frame_type::write_ack, write_ack_bytes).be(a.id).be(a.status).out);
}

std::optional<hello> parse_hello(std::span<const std::byte> body) {
  if (body.size() != hello_bytes) return std::nullopt;
  reader r{body};
  if (!r.preamble()) return std::nullopt;
  hello h;
  const auto auth = read_auth(r);
  if (!auth) return std::nullopt;
  h.auth = *auth;
  h.from = r.be<std::uint32_t>();
  h.to = r.be<std::uint32_t>();
  h.nonce = r.bytes<32>();
  return h;
}

std::optional<challenge> parse_challenge(std::span<const std::byte> body) {
  if (body.size() != challenge_bytes) return std::nullopt;
  reader r{body};
  if (!r.preamble()) return std::nullopt;
  challenge c;
  const auto auth = read_auth(r);
  if (!auth) return std::nullopt;
  c.auth = *auth;
  c.from = r.be<std::uint32_t>();
  c.nonce = r.bytes<32>();
  c.proof = r.bytes<32>();
  return c;
}

std::optional<link_proof> parse_proof(std::span<const std::byte> body) {
  if (body.size() != proof_bytes) return std::nullopt;
  return reader{body}.bytes<32>();
}

std::optional<std::uint16_t> parse_refuse(std::span<const std::byte> body) {
  if (body.size() != refuse_bytes) return std::nullopt;
  return reader{body}.be<std::uint16_t>();
}

std::optional<write_header> parse_write(std::span<const std::byte> body) {
  if (body.size() != write_header_bytes) return std::nullopt;
  reader r{body};
  return read_write(r);
}

std::optional<local_write_header> parse_local_write(std::span<const std::byte> body) {
  if (body.size() != local_write_bytes) return std::nullopt;
  reader r{body};
  local_write_header h;
  h.write = read_write(r);
  h.pid = r.be<std::uint32_t>();
  h.source = r.be<std::uint64_t>();
  h.host = r.be<std::uint64_t>();
  return h;
}

std::optional<write_ack> parse_write_ack(std::span<const std::byte> body) {
  if (body.size() != write_ack_bytes) return std::nullopt;
  reader r{body};
  write_ack a;
  a.id = r.be<std::uint64_t>();
  a.status = r.be<std::uint16_t>();
  return a;
}

}  // namespace ferry::tcp_link
