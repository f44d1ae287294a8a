#pragma once
/// The authenticated links of one fabric endpoint: our side of each link we send on (as client),
/// their side of each link we receive on (as server), the handshake that proves the job secret
/// both ways, and the seal on every later message. Bytes in, bytes out: the transport carries
/// them, so the logic runs without a provider (tests/transport/link_sessions_test.cpp).
#include <cstddef>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/fabric/message_format.hpp"
#include "transport/link_auth.hpp"

namespace ferry::fabric_link {

/// Owning loop only.
class link_sessions {
 public:
  /// Servers answer at most this many handshakes at once; more hellos are refused.
  static constexpr std::size_t max_pending_handshakes = 64;

  link_sessions(job_secret secret, node_id self);

  /// With a job secret every link is proven and every message but a handshake sealed.
  bool sealed() const { return !secret_.empty(); }
  /// Frames and writes to `peer` may leave: no secret, or our handshake with it is done.
  bool ready(node_id peer) const;

  /// The hello that opens our link to `peer`, whose frames wait until it is proven; nothing
  /// without a secret or while a handshake with `peer` is under way or done.
  std::optional<std::vector<std::byte>> open(node_id peer, std::span<const std::byte> our_name);
  /// What a challenge from `from` calls for: our proof to send, or why there is none.
  struct answer {
    enum class verdict { unexpected, wrong_secret, proof } verdict;
    std::vector<std::byte> proof;  ///< the proof step's body
  };
  answer on_challenge(node_id from, const handshake_message& challenge);
  /// The provider took our proof for `peer`: its link is ready.
  void proof_taken(node_id peer);
  /// Forgets our side of the link to `peer`: its next frame starts a new handshake.
  void close(node_id peer) { clients_.erase(peer); }

  /// Whether a hello from `from` may be answered: a handshake of its own under way, or fewer than
  /// `max_pending_handshakes` under way.
  bool may_answer(node_id from) const;
  /// The challenge step's body answering `from`'s hello; its handshake is now under way.
  std::vector<std::byte> challenge(node_id from, const link_nonce& client_nonce);
  enum class proof_verdict { unexpected, wrong_secret, proven };
  /// `from`'s proof: once `proven`, its sealed messages are accepted.
  proof_verdict on_proof(node_id from, const handshake_message& proof);
  /// Drops `from`'s handshake under way. A proven link from it stays: fabric has no connection
  /// whose end would tell a member given up while cut off, so it still seals with that key when
  /// the link returns, and must be heard.
  void drop_pending(node_id from);

  /// Fills the seal of `message` (a whole message of `len` bytes, trailer written) for `peer`'s
  /// link; the sequence number is used up only once the provider took it (`sealed_sent`).
  void seal(node_id peer, std::byte* message, std::size_t len) const;
  void sealed_sent(node_id peer);
  /// Checks the seal of a message from `from`: its link's key, and a sequence number not seen.
  bool open_seal(node_id from, const std::byte* message, std::size_t len);

 private:
  struct client {
    client_handshake handshake;
    enum class step { hello_sent, proving, ready } at = step::hello_sent;
    link_proof key{};  ///< seals our messages, from `proving` on
    std::uint64_t next_seq = 0;
  };
  struct server {
    std::optional<link_proof> key;            ///< once the peer proved the secret
    std::uint64_t next_seq = 0;               ///< lowest sequence number still accepted
    std::optional<server_handshake> pending;  ///< mid-handshake
  };

  job_secret secret_;
  node_id self_;
  std::unordered_map<node_id, client> clients_;
  std::unordered_map<node_id, server> servers_;
};

}  // namespace ferry::fabric_link
