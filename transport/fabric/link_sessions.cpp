#include "transport/fabric/link_sessions.hpp"

#include <algorithm>
#include <cstring>

namespace ferry::fabric_link {
namespace {

/// The bytes a seal's tag covers besides the body: the sender id and the trailer.
std::array<std::byte, message_overhead> head_of(const std::byte* message, std::size_t len) {
  std::array<std::byte, message_overhead> head;
  std::memcpy(head.data(), message, frame_prefix_bytes);
  std::memcpy(head.data() + frame_prefix_bytes, message + len - trailer_bytes, trailer_bytes);
  return head;
}

}  // namespace

link_sessions::link_sessions(job_secret secret, node_id self)
    : secret_(std::move(secret)), self_(self) {}

bool link_sessions::ready(node_id peer) const {
  if (!sealed()) return true;
  auto it = clients_.find(peer);
  return it != clients_.end() && it->second.at == client::step::ready;
}

std::optional<std::vector<std::byte>> link_sessions::open(node_id peer,
                                                          std::span<const std::byte> our_name) {
  if (!sealed() || clients_.contains(peer)) return std::nullopt;
  const auto& c =
      clients_.emplace(peer, client{.handshake = client_handshake(self_, peer)}).first->second;
  return encode_hello(c.handshake.nonce(), our_name);
}

link_sessions::answer link_sessions::on_challenge(node_id from,
                                                  const handshake_message& challenge) {
  auto it = clients_.find(from);
  if (it == clients_.end() || it->second.at != client::step::hello_sent ||
      it->second.handshake.nonce() != challenge.client_nonce)
    return {.verdict = answer::verdict::unexpected, .proof = {}};
  auto& c = it->second;
  const auto ours = c.handshake.answer(secret_, challenge.server_nonce, challenge.proof);
  if (!ours) return {.verdict = answer::verdict::wrong_secret, .proof = {}};
  c.key = c.handshake.session_key(secret_);
  c.next_seq = 0;
  c.at = client::step::proving;
  return {.verdict = answer::verdict::proof, .proof = encode_proof(challenge.server_nonce, *ours)};
}

void link_sessions::proof_taken(node_id peer) {
  if (auto c = clients_.find(peer); c != clients_.end() && c->second.at == client::step::proving)
    c->second.at = client::step::ready;
}

bool link_sessions::may_answer(node_id from) const {
  if (auto own = servers_.find(from); own != servers_.end() && own->second.pending) return true;
  const auto pending =
      std::ranges::count_if(servers_, [](const auto& e) { return e.second.pending.has_value(); });
  return static_cast<std::size_t>(pending) < max_pending_handshakes;
}

std::vector<std::byte> link_sessions::challenge(node_id from, const link_nonce& client_nonce) {
  const auto& handshake = servers_[from].pending.emplace(self_, from, client_nonce);
  return encode_challenge(client_nonce, handshake.nonce(), handshake.proof(secret_));
}

link_sessions::proof_verdict link_sessions::on_proof(node_id from, const handshake_message& proof) {
  auto it = servers_.find(from);
  if (it == servers_.end() || !it->second.pending ||
      it->second.pending->nonce() != proof.server_nonce)
    return proof_verdict::unexpected;
  auto& session = it->second;
  const auto handshake = *session.pending;
  session.pending.reset();
  if (!handshake.holds(secret_, proof.proof)) return proof_verdict::wrong_secret;
  session.key = handshake.session_key(secret_);
  session.next_seq = 0;
  return proof_verdict::proven;
}

void link_sessions::drop_pending(node_id from) {
  auto it = servers_.find(from);
  if (it == servers_.end()) return;
  it->second.pending.reset();
  if (!it->second.key) servers_.erase(it);
}

void link_sessions::seal(node_id peer, std::byte* message, std::size_t len) const {
  auto it = clients_.find(peer);
  if (!sealed() || it == clients_.end()) return;  // (never: nothing leaves before the handshake)
  const auto& c = it->second;
  const auto head = head_of(message, len);
  std::byte* at = message + len - trailer_bytes - seal_bytes;
  put_be64(at, c.next_seq);
  const auto tag =
      make_message_tag(c.key, c.next_seq, head, std::span(message + frame_prefix_bytes, at));
  std::memcpy(at + 8, tag.data(), tag.size());
}

void link_sessions::sealed_sent(node_id peer) {
  if (auto it = clients_.find(peer); sealed() && it != clients_.end()) ++it->second.next_seq;
}

bool link_sessions::open_seal(node_id from, const std::byte* message, std::size_t len) {
  auto it = servers_.find(from);
  if (it == servers_.end() || !it->second.key) return false;
  auto& session = it->second;
  const auto head = head_of(message, len);
  const std::byte* at = message + len - trailer_bytes - seal_bytes;
  const std::uint64_t seq = get_be64(at);
  message_tag tag;
  std::memcpy(tag.data(), at + 8, tag.size());
  const auto expected =
      make_message_tag(*session.key, seq, head, std::span(message + frame_prefix_bytes, at));
  if (!same_tag(tag, expected) || seq < session.next_seq) return false;
  session.next_seq = seq + 1;
  return true;
}

}  // namespace ferry::fabric_link
