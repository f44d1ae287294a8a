#include "transport/fabric/message_format.hpp"

#include <cstring>

#include "transport/errc.hpp"

namespace ferry::fabric_link {
namespace {

constexpr std::size_t nonce_bytes = std::tuple_size_v<link_nonce>;
constexpr std::size_t proof_bytes = std::tuple_size_v<link_proof>;

std::vector<std::byte> handshake_body(handshake_step step,
                                      std::initializer_list<std::span<const std::byte>> fields) {
  std::vector<std::byte> body{static_cast<std::byte>(step)};
  for (const auto f : fields) body.insert(body.end(), f.begin(), f.end());
  return body;
}

template <class Bytes>
Bytes read_at(std::span<const std::byte> fields, std::size_t at) {
  Bytes out;
  std::memcpy(out.data(), fields.data() + at, out.size());
  return out;
}

}  // namespace

std::uint32_t make_trailer(message_kind kind, std::size_t payload) {
  return static_cast<std::uint32_t>(kind) << 30 | static_cast<std::uint32_t>(payload);
}

message_kind kind_of(std::uint32_t trailer) {
  return static_cast<message_kind>(trailer >> 30);
}

void put_be32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}
std::uint32_t get_be32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | std::to_integer<std::uint32_t>(p[i]);
  return v;
}
void put_be64(std::byte* p, std::uint64_t v) {
  put_be32(p, static_cast<std::uint32_t>(v >> 32));
  put_be32(p + 4, static_cast<std::uint32_t>(v));
}
std::uint64_t get_be64(const std::byte* p) {
  return std::uint64_t{get_be32(p)} << 32 | get_be32(p + 4);
}

void encode_notice(std::byte* at, const notice& n) {
  put_be64(at, n.address);
  put_be64(at + 8, n.length);
  put_be32(at + 16, n.imm);
}

std::optional<notice> parse_notice(std::span<const std::byte> payload) {
  if (payload.size() != notice_bytes) return std::nullopt;
  return notice{.address = get_be64(payload.data()),
                .length = get_be64(payload.data() + 8),
                .imm = get_be32(payload.data() + 16)};
}

std::vector<std::byte> encode_hello(const link_nonce& client_nonce,
                                    std::span<const std::byte> name) {
  return handshake_body(handshake_step::hello, {client_nonce, name});
}

std::vector<std::byte> encode_challenge(const link_nonce& client_nonce,
                                        const link_nonce& server_nonce,
                                        const link_proof& server_proof) {
  return handshake_body(handshake_step::challenge, {client_nonce, server_nonce, server_proof});
}

std::vector<std::byte> encode_proof(const link_nonce& server_nonce,
                                    const link_proof& client_proof) {
  return handshake_body(handshake_step::proof, {server_nonce, client_proof});
}

std::optional<handshake_message> parse_handshake(std::span<const std::byte> body) {
  if (body.empty()) return std::nullopt;
  handshake_message m{.step = static_cast<handshake_step>(body[0])};
  const auto fields = body.subspan(1);
  switch (m.step) {
    case handshake_step::hello:
      if (fields.size() <= nonce_bytes || fields.size() > nonce_bytes + max_name_bytes)
        return std::nullopt;
      m.client_nonce = read_at<link_nonce>(fields, 0);
      m.name = fields.subspan(nonce_bytes);
      return m;
    case handshake_step::challenge:
      if (fields.size() != 2 * nonce_bytes + proof_bytes) return std::nullopt;
      m.client_nonce = read_at<link_nonce>(fields, 0);
      m.server_nonce = read_at<link_nonce>(fields, nonce_bytes);
      m.proof = read_at<link_proof>(fields, 2 * nonce_bytes);
      return m;
    case handshake_step::proof:
      if (fields.size() != nonce_bytes + proof_bytes) return std::nullopt;
      m.server_nonce = read_at<link_nonce>(fields, 0);
      m.proof = read_at<link_proof>(fields, nonce_bytes);
      return m;
  }
  return std::nullopt;
}

std::string hex_encode(std::span<const std::byte> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (const auto byte : bytes) {
    const auto b = std::to_integer<unsigned>(byte);
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

result<std::vector<std::byte>> hex_decode(std::string_view text) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.empty() || text.size() % 2 != 0 || text.size() > 1024)
    return fail(transport_errc::bad_address);
  std::vector<std::byte> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return fail(transport_errc::bad_address);
    out[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  return out;
}

}  // namespace ferry::fabric_link
