#pragma once
/// The job secret and the HMAC-SHA256 proofs of the link handshakes of tcp and fabric, and the
/// tags that fabric puts on every message of a link (docs/wire-format.md).
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/message.hpp"

namespace ferry {

/// The bytes every process of one job shares; whoever holds them may join the job's links.
using job_secret = std::vector<std::byte>;
/// Shorter secrets are refused: they could be guessed offline from one recorded handshake.
inline constexpr std::size_t min_secret_bytes = 16;

/// Reads the job secret from the file named by `FERRY_SECRET_FILE`, else from the bytes of
/// `FERRY_SECRET`; empty when neither is set. Errors: unreadable file, or a secret shorter than
/// `min_secret_bytes` (`errc::invalid_argument`). Never takes the secret from a command line.
result<job_secret> load_job_secret();
/// Reads a secret from `path`; one trailing newline ("\n" or "\r\n") is not part of it.
result<job_secret> load_job_secret_file(const std::filesystem::path& path);

using link_nonce = std::array<std::byte, 32>;
using link_proof = std::array<std::byte, 32>;

/// Which side of a link a proof speaks for; the labels keep one side's proof from being replayed
/// as the other's. `session` derives a link's message key (fabric) instead of a proof; `watch`
/// greets a peer's liveness watch (transport/peer_watch.hpp).
enum class link_role : std::uint8_t { client, server, session, watch };

/// 32 random bytes from libsodium's CSPRNG.
link_nonce make_link_nonce();
/// HMAC-SHA256(secret, label(role) || client_nonce || server_nonce || be32(client) ||
/// be32(server)).
link_proof make_link_proof(std::span<const std::byte> secret, link_role role,
                           const link_nonce& client_nonce, const link_nonce& server_nonce,
                           node_id client, node_id server);
/// Constant-time comparison.
bool same_proof(const link_proof& a, const link_proof& b);

/// The client's side of one link handshake (docs/wire-format.md), the same steps on tcp and fabric
/// whatever frames carry them: open with `nonce()`; `answer` the server's challenge.
class client_handshake {
 public:
  client_handshake(node_id client, node_id server);
  const link_nonce& nonce() const { return nonce_; }
  /// Our proof, where the server's over its nonce holds under `secret`; nothing where it does
  /// not (the server does not hold the job secret).
  std::optional<link_proof> answer(std::span<const std::byte> secret,
                                   const link_nonce& server_nonce, const link_proof& server_proof);
  /// The key of the link's seals, once answered.
  link_proof session_key(std::span<const std::byte> secret) const;

 private:
  node_id client_;
  node_id server_;
  link_nonce nonce_;
  link_nonce server_nonce_{};
};

/// The server's side of one link handshake, from the client's hello.
class server_handshake {
 public:
  server_handshake(node_id server, node_id client, const link_nonce& client_nonce);
  const link_nonce& nonce() const { return nonce_; }
  /// Our proof, sent with our nonce in the challenge.
  link_proof proof(std::span<const std::byte> secret) const;
  /// The client's proof holds: it has the job secret.
  bool holds(std::span<const std::byte> secret, const link_proof& client_proof) const;
  link_proof session_key(std::span<const std::byte> secret) const;

 private:
  node_id server_;
  node_id client_;
  link_nonce client_nonce_;
  link_nonce nonce_;
};

using message_tag = std::array<std::byte, 16>;
/// HMAC-SHA256(key, be64(sequence) || head || body), its first 16 bytes.
message_tag make_message_tag(const link_proof& key, std::uint64_t sequence,
                             std::span<const std::byte> head, std::span<const std::byte> body);
/// Constant-time comparison.
bool same_tag(const message_tag& a, const message_tag& b);

}  // namespace ferry
