#include "transport/link_auth.hpp"

#include <sodium.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

namespace ferry {
namespace {

/// libsodium must be initialised once per process before its CSPRNG is used.
void ensure_sodium() {
  static const int ready = sodium_init();
  (void)ready;  // 1 when already initialised elsewhere; -1 cannot happen on Linux with getrandom.
}

result<job_secret> checked(job_secret secret) {
  if (secret.size() < min_secret_bytes) return fail(errc::invalid_argument);
  return secret;
}

constexpr std::string_view label(link_role role) {
  switch (role) {
    case link_role::client:
      return "ferry-link-1 client";
    case link_role::server:
      return "ferry-link-1 server";
    case link_role::session:
      return "ferry-link-1 session";
    case link_role::watch:
      return "ferry-link-1 watch";
  }
  return "";
}

const unsigned char* bytes(const void* p) {
  return static_cast<const unsigned char*>(p);
}

}  // namespace

result<job_secret> load_job_secret_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::make_error_code(std::errc::no_such_file_or_directory));
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return fail(std::make_error_code(std::errc::io_error));
  if (bytes.ends_with("\r\n")) {
    bytes.resize(bytes.size() - 2);
  } else if (bytes.ends_with('\n')) {
    bytes.pop_back();
  }
  const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
  return checked(job_secret(p, p + bytes.size()));
}

result<job_secret> load_job_secret() {
  if (const char* file = std::getenv("FERRY_SECRET_FILE"); file && *file)
    return load_job_secret_file(file);
  if (const char* value = std::getenv("FERRY_SECRET"); value && *value) {
    const std::string_view s(value);
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return checked(job_secret(p, p + s.size()));
  }
  return job_secret{};
}

link_nonce make_link_nonce() {
  ensure_sodium();
  link_nonce n;
  randombytes_buf(n.data(), n.size());
  return n;
}

link_proof make_link_proof(std::span<const std::byte> secret, link_role role,
                           const link_nonce& client_nonce, const link_nonce& server_nonce,
                           node_id client, node_id server) {
  ensure_sodium();
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(secret.data()),
                              secret.size());
  const auto text = label(role);
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(text.data()),
                                text.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(client_nonce.data()),
                                client_nonce.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(server_nonce.data()),
                                server_nonce.size());
  unsigned char ids[8];
  for (int i = 0; i < 4; ++i) {
    ids[i] = static_cast<unsigned char>(client >> (24 - 8 * i));
    ids[4 + i] = static_cast<unsigned char>(server >> (24 - 8 * i));
  }
  crypto_auth_hmacsha256_update(&state, ids, sizeof ids);
  link_proof proof;
  crypto_auth_hmacsha256_final(&state, reinterpret_cast<unsigned char*>(proof.data()));
  sodium_memzero(&state, sizeof state);
  return proof;
}

bool same_proof(const link_proof& a, const link_proof& b) {
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

message_tag make_message_tag(const link_proof& key, std::uint64_t sequence,
                             std::span<const std::byte> head, std::span<const std::byte> body) {
  ensure_sodium();
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, bytes(key.data()), key.size());
  unsigned char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
  crypto_auth_hmacsha256_update(&state, seq, sizeof seq);
  crypto_auth_hmacsha256_update(&state, bytes(head.data()), head.size());
  crypto_auth_hmacsha256_update(&state, bytes(body.data()), body.size());
  unsigned char full[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_final(&state, full);
  sodium_memzero(&state, sizeof state);
  message_tag tag;
  std::memcpy(tag.data(), full, tag.size());
  return tag;
}

bool same_tag(const message_tag& a, const message_tag& b) {
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

client_handshake::client_handshake(node_id client, node_id server)
    : client_(client), server_(server), nonce_(make_link_nonce()) {}

std::optional<link_proof> client_handshake::answer(std::span<const std::byte> secret,
                                                   const link_nonce& server_nonce,
                                                   const link_proof& server_proof) {
  const auto expected =
      make_link_proof(secret, link_role::server, nonce_, server_nonce, client_, server_);
  if (!same_proof(server_proof, expected)) return std::nullopt;
  server_nonce_ = server_nonce;
  return make_link_proof(secret, link_role::client, nonce_, server_nonce, client_, server_);
}

link_proof client_handshake::session_key(std::span<const std::byte> secret) const {
  return make_link_proof(secret, link_role::session, nonce_, server_nonce_, client_, server_);
}

server_handshake::server_handshake(node_id server, node_id client, const link_nonce& client_nonce)
    : server_(server), client_(client), client_nonce_(client_nonce), nonce_(make_link_nonce()) {}

link_proof server_handshake::proof(std::span<const std::byte> secret) const {
  return make_link_proof(secret, link_role::server, client_nonce_, nonce_, client_, server_);
}

bool server_handshake::holds(std::span<const std::byte> secret,
                             const link_proof& client_proof) const {
  return same_proof(client_proof, make_link_proof(secret, link_role::client, client_nonce_, nonce_,
                                                  client_, server_));
}

link_proof server_handshake::session_key(std::span<const std::byte> secret) const {
  return make_link_proof(secret, link_role::session, client_nonce_, nonce_, client_, server_);
}

}  // namespace ferry
