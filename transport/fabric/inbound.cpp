// What arrives at a fabric transport: control messages and their fragments, handshake steps,
// write notices and writes with remote CQ data.
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstring>

#include "runtime/log.hpp"
#include "transport/errc.hpp"
#include "transport/fabric/fabric_impl.hpp"

namespace ferry {

using namespace fabric_link;

/// Posts rx slot `i`; false when the provider is busy.
bool fabric_transport::impl::post_rx(std::uint64_t i) {
  op* o = rx_ops[i];
  std::memset(&o->ctx, 0, sizeof(o->ctx));
  void* desc = rx_mr ? fi_mr_desc(rx_mr) : nullptr;
  const ssize_t rc =
      fi_recv(provider->ep, rx_slab.get() + i * rx_slot(), rx_slot(), desc, FI_ADDR_UNSPEC, o);
  if (rc == -FI_EAGAIN) return false;
  if (rc) log::error("fabric: fi_recv failed: {}", fi_error_text(static_cast<int>(rc)));
  return true;
}

void fabric_transport::impl::repost_rx(std::uint64_t i) {
  if (!rx_waiting.empty() || !post_rx(i)) {
    ++counters.eagain_retries;
    rx_waiting.push_back(i);
  }
}

void fabric_transport::impl::on_message(std::uint64_t slot, std::size_t len) {
  const std::byte* buf = rx_slab.get() + slot * rx_slot();
  // Some providers (shm) truncate an oversize message silently: the trailer must match.
  const std::uint32_t trailer = len >= message_overhead ? get_be32(buf + len - trailer_bytes) : 0;
  const auto kind = kind_of(trailer);
  const std::size_t seal = overhead(kind) - message_overhead;
  const node_id from = len >= frame_prefix_bytes ? get_be32(buf) : 0;
  if (len < message_overhead + seal || (trailer & length_mask) != len - message_overhead - seal) {
    // Unsealed where seals are due: a peer without the secret, or a truncated message.
    if (seal) return refuse_unauthenticated(from, "unsealed");
    return reject_message("truncated or malformed", len);
  }
  if (seal && !sessions.open_seal(from, buf, len)) return refuse_unauthenticated(from, "bad seal");
  const std::span payload(buf + frame_prefix_bytes, len - message_overhead - seal);
  switch (kind) {
    case message_kind::frame:
    case message_kind::fragment:
      return on_piece(from, payload, kind == message_kind::frame, len);
    case message_kind::notice:
      if (const auto n = parse_notice(payload)) return on_write_notice(from, *n);
      return reject_message("malformed write notice", len);
    case message_kind::handshake:
      if (!sealed()) return reject_message("a handshake, without a job secret here", len);
      return on_handshake(from, payload);
  }
}

void fabric_transport::impl::on_piece(node_id from, std::span<const std::byte> payload, bool last,
                                      std::size_t len) {
  const auto made = assembly.add(from, payload, last);
  if (made.state == frame_assembly::piece_state::whole) return deliver_frame(from, made.frame);
  if (made.state == frame_assembly::piece_state::over_limit)
    reject_message("over the frame limit", len);
}

void fabric_transport::impl::refuse_unauthenticated(node_id claimed, const char* why) {
  // Logged at 1, 2, 4, 8, ... so a flood of forgeries cannot flood the log.
  if (const auto n = ++counters.unauthenticated; (n & (n - 1)) == 0)
    log::warn(
        "fabric: refused {} unauthenticated message(s) so far (the last {}, claiming node {})", n,
        why, claimed);
}

void fabric_transport::impl::reject_message(const char* why, std::size_t len) {
  ++counters.frames_rejected;
  log::warn("fabric: dropped a {}-byte control message ({})", len, why);
}

void fabric_transport::impl::deliver_frame(node_id from, std::span<const std::byte> payload) {
  ++counters.frames_received;
  if (events.on_frame) events.on_frame(from, payload);
}

/// The region and offset of [p, p + length) if it lies inside a region we gave out.
std::optional<std::pair<std::uint64_t, std::uint64_t>> fabric_transport::impl::find_landing(
    const std::byte* p, std::uint64_t length) const {
  auto it = by_base.upper_bound(p);
  if (it == by_base.begin()) return std::nullopt;
  const auto& r = regions.at(std::prev(it)->second);
  const auto offset = static_cast<std::uint64_t>(p - r.memory.data());
  if (offset > r.memory.size() || length > r.memory.size() - offset) return std::nullopt;
  return std::pair{r.id, offset};
}

/// An `inject_only` writer says its write landed at `n.address` (ours, FI_MR_VIRT_ADDR).
void fabric_transport::impl::on_write_notice(node_id from, const notice& n) {
  const auto landing = find_landing(reinterpret_cast<const std::byte*>(n.address), n.length);
  if (!landing) {
    ++counters.writes_refused;
    log::error("fabric: node {} reported a write outside every registered region; dropped", from);
    return;
  }
  ++counters.writes_received;
  if (events.on_write)
    events.on_write({.from = from,
                     .region = landing->first,
                     .offset = landing->second,
                     .length = n.length,
                     .imm = n.imm});
}

void fabric_transport::impl::on_remote_write(const fi_cq_data_entry& e) {
  ++counters.writes_received;
  write_notice n{
      .from = 0, .region = 0, .offset = 0, .length = e.len, .imm = static_cast<write_imm>(e.data)};
  if (e.buf) {
    // Where the provider says where bytes landed, check it is inside a region we gave out.
    const auto landing = find_landing(static_cast<const std::byte*>(e.buf), e.len);
    if (!landing) {
      ++counters.writes_refused;
      log::error("fabric: provider reported a write outside every registered region; dropped");
      return;
    }
    n.region = landing->first;
    n.offset = landing->second;
  }
  if (events.on_write) events.on_write(n);
}

// ---- handshakes ----------------------------------------------------------------------------

void fabric_transport::impl::on_handshake(node_id from, std::span<const std::byte> body) {
  const auto message = parse_handshake(body);
  if (!message) return refuse_unauthenticated(from, "malformed handshake");
  switch (message->step) {
    case handshake_step::hello:
      return on_hello(from, *message);
    case handshake_step::challenge:
      return on_challenge(from, *message);
    case handshake_step::proof:
      return on_proof(from, *message);
  }
}

/// Server: a peer claiming `from` starts a link to us; answer where its hello says it is.
void fabric_transport::impl::on_hello(node_id from, const handshake_message& hello) {
  if (!sessions.may_answer(from)) {
    ++counters.handshakes_refused;
    return;
  }
  release_temporary(from);
  fi_addr_t reply = FI_ADDR_UNSPEC;
  if (auto known = peer_names.find(from);
      known != peer_names.end() && std::ranges::equal(known->second, hello.name)) {
    reply = peers.at(from);
  } else if (const auto inserted = provider->insert(hello.name)) {
    reply = temporary[from] = *inserted;
  } else {
    return refuse_unauthenticated(from, "hello with a bad address");
  }
  send_handshake(from, reply, sessions.challenge(from, hello.client_nonce), false);
}

/// Client: the server proved the secret; prove it back, and seal from now on.
void fabric_transport::impl::on_challenge(node_id from, const handshake_message& challenge) {
  auto answer = sessions.on_challenge(from, challenge);
  switch (answer.verdict) {
    case link_sessions::answer::verdict::unexpected:
      return refuse_unauthenticated(from, "unexpected challenge");
    case link_sessions::answer::verdict::wrong_secret:
      ++counters.handshakes_refused;
      log::warn("fabric: node {} does not hold the job secret; giving up on it", from);
      abandon(from, transport_errc::unauthenticated);
      return report_peer_lost(from, transport_errc::unauthenticated);
    case link_sessions::answer::verdict::proof:
      return send_handshake(from, peers.at(from), std::move(answer.proof), true);
  }
}

/// Server: the client proved the secret; its sealed messages are accepted from now on.
void fabric_transport::impl::on_proof(node_id from, const handshake_message& proof) {
  const auto verdict = sessions.on_proof(from, proof);
  if (verdict == link_sessions::proof_verdict::unexpected)
    return refuse_unauthenticated(from, "unexpected proof");
  release_temporary(from);
  if (verdict == link_sessions::proof_verdict::wrong_secret) {
    ++counters.handshakes_refused;
    log::warn("fabric: a peer claiming node {} does not hold the job secret", from);
  }
}

void fabric_transport::impl::release_temporary(node_id peer) {
  auto it = temporary.find(peer);
  if (it == temporary.end()) return;
  provider->remove(it->second);
  temporary.erase(it);
}

}  // namespace ferry
