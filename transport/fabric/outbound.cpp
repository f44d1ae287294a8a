// What leaves a fabric transport (control frames, their fragments, writes, write notices and
// handshake steps), what waits for the provider to take it, and giving up on a peer.
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>

#include "runtime/log.hpp"
#include "transport/errc.hpp"
#include "transport/fabric/fabric_impl.hpp"

namespace ferry {

using namespace fabric_link;
using steady = std::chrono::steady_clock;

/// Bytes a message of `kind` carries besides its body: the sender id, the trailer and, with a
/// secret, the seal (never on a handshake).
std::size_t fabric_transport::impl::overhead(message_kind kind) const {
  return message_overhead + (sealed() && kind != message_kind::handshake ? seal_bytes : 0);
}

/// Writes the sender id and the trailer around a body of `body` bytes already in place after the
/// id; `message` holds `body + overhead(kind)` bytes. The seal is made as it leaves.
void fabric_transport::impl::frame_message(std::byte* message, std::size_t body,
                                           message_kind kind) const {
  put_be32(message, self);
  put_be32(message + body + overhead(kind) - trailer_bytes, make_trailer(kind, body));
}

// ---- handshakes ----------------------------------------------------------------------------

/// Starts our side of the link to `peer`: its frames wait until the handshake is done.
void fabric_transport::impl::start_handshake(node_id peer) {
  if (!peers.contains(peer)) return;
  if (auto hello = sessions.open(peer, provider->name))
    send_handshake(peer, peers.at(peer), std::move(*hello), false);
}

void fabric_transport::impl::send_handshake(node_id peer, fi_addr_t addr,
                                            std::vector<std::byte> body, bool readies) {
  const auto id = next_op_id++;
  auto& h = handshakes[id];
  h.bytes.resize(body.size() + overhead(message_kind::handshake));
  std::memcpy(h.bytes.data() + frame_prefix_bytes, body.data(), body.size());
  frame_message(h.bytes.data(), body.size(), message_kind::handshake);
  h.addr = addr;
  h.peer = peer;
  h.readies = readies;
  h.since = steady::now();
  if (!handshakes_waiting.empty() || !issue_handshake(id)) handshakes_waiting.push_back(id);
  progress->poke();
}

/// False on -FI_EAGAIN. Failures are only logged: the link's traffic notices a dead peer.
bool fabric_transport::impl::issue_handshake(std::uint64_t id) {
  auto& h = handshakes.at(id);
  ssize_t rc;
  op* o = nullptr;
  if (h.bytes.size() <= provider->inject_limit) {
    rc = fi_inject(provider->ep, h.bytes.data(), h.bytes.size(), h.addr);
  } else {
    o = ops.take(op_kind::handshake, id);
    rc = fi_send(provider->ep, h.bytes.data(), h.bytes.size(), nullptr, h.addr, o);
  }
  if (rc && o) ops.give(o);
  if (rc == -FI_EAGAIN) return false;
  if (rc) {
    log::debug("fabric: handshake message to node {} failed: {}", h.peer,
               fi_error_text(static_cast<int>(rc)));
    handshakes.erase(id);
    return true;
  }
  if (h.readies) sessions.proof_taken(h.peer);
  if (!o) handshakes.erase(id);
  return true;
}

void fabric_transport::impl::retry_handshakes() {
  const auto now = steady::now();
  while (running && !handshakes_waiting.empty()) {
    const auto id = handshakes_waiting.front();
    if (now - handshakes.at(id).since > options.stall_timeout) {
      handshakes.erase(id);  // its peer's traffic, if any, notices the stall
    } else if (!issue_handshake(id)) {
      return;
    }
    handshakes_waiting.pop_front();
  }
}

// ---- control frames ------------------------------------------------------------------------

/// Issues send `id`; false on -FI_EAGAIN.
bool fabric_transport::impl::issue_send(std::uint64_t id) {
  auto& s = sends.at(id);
  if (auto p = peers.find(s.peer); p != peers.end()) s.addr = p->second;  // after a reconnect
  if (provider->inject_only) return inject_send(id);
  sessions.seal(s.peer, s.bytes.data(), s.bytes.size());
  op* o = ops.take(op_kind::send, id);
  void* desc = s.mr ? fi_mr_desc(s.mr) : nullptr;
  const ssize_t rc = fi_send(provider->ep, s.bytes.data(), s.bytes.size(), desc, s.addr, o);
  if (rc) ops.give(o);
  if (rc == -FI_EAGAIN) return false;
  if (rc) {
    log::warn("fabric: fi_send to node {} failed: {}", s.peer, fi_error_text(static_cast<int>(rc)));
    finish_send(id, map_op_error(static_cast<int>(-rc)));
    return true;
  }
  s.issued = true;
  sessions.sealed_sent(s.peer);
  op_accepted(s.peer);
  // rxm sends a frame above its eager size by another protocol, whose receive completes after
  // those of smaller frames sent later (even under FI_ORDER_SAS): until such a frame is done,
  // nothing else leaves for that peer. Frames within inject_size are always eager.
  if (s.bytes.size() > provider->inject_limit) {
    s.holds_order = true;
    traffic.hold_order(s.peer);
  }
  return true;
}

/// Injects what is left of send `id`, in fragments if it is larger than the provider injects.
/// Injected messages have no completion: the send is done once the last is accepted.
bool fabric_transport::impl::inject_send(std::uint64_t id) {
  auto& s = sends.at(id);
  const std::size_t limit = provider->inject_limit;
  if (s.bytes.size() <= limit) {
    sessions.seal(s.peer, s.bytes.data(), s.bytes.size());
    const ssize_t rc = fi_inject(provider->ep, s.bytes.data(), s.bytes.size(), s.addr);
    if (rc == -FI_EAGAIN) return false;
    return finish_injected(id, rc);
  }
  const std::size_t extra = overhead(message_kind::frame);
  const std::span payload(s.bytes.data() + frame_prefix_bytes, s.bytes.size() - extra);
  std::vector<std::byte> piece(limit);
  while (s.injected < payload.size()) {
    const std::size_t n = std::min(limit - extra, payload.size() - s.injected);
    const bool last = s.injected + n == payload.size();
    std::memcpy(piece.data() + frame_prefix_bytes, payload.data() + s.injected, n);
    frame_message(piece.data(), n, last ? message_kind::frame : message_kind::fragment);
    sessions.seal(s.peer, piece.data(), n + extra);
    const ssize_t rc = fi_inject(provider->ep, piece.data(), n + extra, s.addr);
    if (rc == -FI_EAGAIN) return false;
    if (rc) return finish_injected(id, rc);
    sessions.sealed_sent(s.peer);
    s.injected += n;
    note_progress(s.peer);
  }
  return finish_injected(id, 0, false);
}

/// `rc` is the last fi_inject's; a whole message injected at once (`sealed_now`) used up a
/// sequence number.
bool fabric_transport::impl::finish_injected(std::uint64_t id, ssize_t rc, bool sealed_now) {
  const auto peer = sends.at(id).peer;
  if (rc) {
    log::warn("fabric: fi_inject to node {} failed: {}", peer, fi_error_text(static_cast<int>(rc)));
  } else {
    if (sealed_now) sessions.sealed_sent(peer);
    note_progress(peer);
  }
  finish_send(id, rc ? map_op_error(static_cast<int>(-rc)) : std::error_code{});
  return true;
}

void fabric_transport::impl::finish_send(std::uint64_t id, std::error_code ec) {
  auto it = sends.find(id);
  if (it == sends.end()) return;
  auto s = std::move(it->second);
  sends.erase(it);
  if (s.mr) fi_close(&s.mr->fid);
  if (s.orphaned) return;
  post_done(std::move(s.done), ec);
  if (is_link_error(ec)) report_peer_lost(s.peer, ec);
}

/// A send completed (or failed) at the provider.
void fabric_transport::impl::on_send_done(op* o, std::error_code ec) {
  const auto id = o->owner;
  ops.give(o);
  if (auto it = sends.find(id); it != sends.end()) {
    const auto& st = it->second;
    if (st.holds_order && !st.orphaned) traffic.release_order(st.peer);
    op_completed(st.peer, st.orphaned);
  }
  finish_send(id, ec);
}

// ---- writes --------------------------------------------------------------------------------

/// Issues what it can of write `id`: body pieces, then (after they landed) the final piece
/// carrying the immediate. False on -FI_EAGAIN.
bool fabric_transport::impl::pump_write(std::uint64_t id) {
  auto it = writes.find(id);
  if (it == writes.end()) return true;
  auto& w = it->second;
  while (!w.error && w.issued < w.body_end) {
    const std::uint64_t n = std::min(provider->max_piece, w.body_end - w.issued);
    const ssize_t rc = issue_piece(w, id, w.issued, n, false);
    if (rc == -FI_EAGAIN) return false;
    if (rc) {
      w.error = map_op_error(static_cast<int>(-rc));
      break;
    }
    w.issued += n;
  }
  if (!w.error && !w.final_issued && w.landed == w.body_end) {
    const ssize_t rc = provider->inject_only
                           ? inject_notice(w)
                           : issue_piece(w, id, w.body_end, w.length - w.body_end, true);
    if (rc == -FI_EAGAIN) return false;
    if (rc)
      w.error = map_op_error(static_cast<int>(-rc));
    else
      w.final_issued = true;
  }
  maybe_finish_write(id);
  return true;
}

/// `inject_only`: every byte of `w` landed; tell its target.
ssize_t fabric_transport::impl::inject_notice(write_state& w) {
  std::byte message[message_overhead + notice_bytes + seal_bytes];
  const std::size_t len = notice_bytes + overhead(message_kind::notice);
  encode_notice(message + frame_prefix_bytes,
                {.address = w.remote_addr, .length = w.length, .imm = w.imm});
  frame_message(message, notice_bytes, message_kind::notice);
  sessions.seal(w.peer, message, len);
  const ssize_t rc = fi_inject(provider->ep, message, len, w.addr);
  if (rc == 0) {
    sessions.sealed_sent(w.peer);
    note_progress(w.peer);
  }
  if (rc && rc != -FI_EAGAIN)
    log::warn("fabric: write notice to node {} failed: {}", w.peer,
              fi_error_text(static_cast<int>(rc)));
  return rc;
}

ssize_t fabric_transport::impl::issue_piece(write_state& w, std::uint64_t id, std::uint64_t at,
                                            std::uint64_t n, bool final) {
  op* o = ops.take(op_kind::write, id, n);
  iovec iov{const_cast<std::byte*>(w.src + at), n};
  void* desc = w.desc;
  fi_rma_iov rma{w.remote_addr + at, n, w.key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = w.addr;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = o;
  msg.data = final ? w.imm : 0;
  // Delivery complete: the writer's completion means the bytes are at the target. (shm copies
  // a write without CQ data in the call, so its completion already means that.)
  const std::uint64_t flags = FI_COMPLETION | (provider->inject_only ? 0 : FI_DELIVERY_COMPLETE) |
                              (final ? FI_REMOTE_CQ_DATA : 0);
  const ssize_t rc = fi_writemsg(provider->ep, &msg, flags);
  if (rc) {
    ops.give(o);
    if (rc != -FI_EAGAIN)
      log::warn("fabric: fi_writemsg to node {} failed: {}", w.peer,
                fi_error_text(static_cast<int>(rc)));
    return rc;
  }
  ++w.in_flight;
  op_accepted(w.peer);
  return 0;
}

void fabric_transport::impl::maybe_finish_write(std::uint64_t id) {
  auto it = writes.find(id);
  if (it == writes.end()) return;
  auto& w = it->second;
  // `inject_only` writes every byte in the body; the notice has no completion.
  const bool done = w.in_flight == 0 && (w.error || (w.final_issued && w.landed == w.length));
  if (!done) return;
  auto state = std::move(w);
  writes.erase(it);
  if (state.error) ++counters.writes_refused;
  if (state.orphaned) return;
  post_done(std::move(state.done), state.error);
  if (is_link_error(state.error)) report_peer_lost(state.peer, state.error);
}

void fabric_transport::impl::on_piece_done(op* o, std::error_code ec) {
  const std::uint64_t id = o->owner;
  const std::uint64_t bytes = o->bytes;
  ops.give(o);
  auto it = writes.find(id);
  if (it == writes.end()) return;  // never: a write outlives its pieces
  auto& w = it->second;
  op_completed(w.peer, w.orphaned);
  --w.in_flight;
  if (ec && !w.error) w.error = ec;
  if (!ec) w.landed += bytes;
  if (w.queued || w.error) return maybe_finish_write(id);
  const auto peer = w.peer;
  if (!pump_write(id)) {
    writes.at(id).queued = true;
    enqueue(peer, {waiting_op::kind::write, id});
  }
}

// ---- what waits ----------------------------------------------------------------------------

void fabric_transport::impl::note_progress(node_id peer) {
  traffic.progressed(peer, steady::now());
}

void fabric_transport::impl::op_accepted(node_id peer) {
  traffic.accepted(peer, steady::now());
}

void fabric_transport::impl::op_completed(node_id peer, bool abandoned) {
  traffic.completed(peer, abandoned, steady::now());
}

void fabric_transport::impl::enqueue(node_id peer, waiting_op w) {
  if (sessions.ready(peer)) ++counters.eagain_retries;
  traffic.wait(peer, w, steady::now());
  start_handshake(peer);
}

/// Nothing may overtake an operation that waits for the same peer, nor leave before its link is.
bool fabric_transport::impl::must_wait(node_id peer) const {
  return !sessions.ready(peer) || traffic.must_wait(peer);
}

/// Retries what the provider refused with -FI_EAGAIN: receive slots, handshakes, then each
/// peer's operations in order, until the provider refuses that peer's next one.
void fabric_transport::impl::retry_waiting() {
  while (running && !rx_waiting.empty() && post_rx(rx_waiting.front())) rx_waiting.pop_front();
  retry_handshakes();
  traffic.retry_waiting([&](node_id peer) { return running && sessions.ready(peer); },
                        [&](waiting_op w) { return retry(w); });
}

/// False while the provider still refuses `w`.
bool fabric_transport::impl::retry(waiting_op w) {
  if (w.what == waiting_op::kind::send) return !sends.contains(w.id) || issue_send(w.id);
  auto it = writes.find(w.id);
  if (it == writes.end()) return true;
  it->second.queued = false;
  if (pump_write(w.id)) return true;
  writes.at(w.id).queued = true;
  return false;
}

/// Fails everything outstanding to `peer` now. Operations the provider holds keep their
/// contexts until they complete, if ever, and no longer keep progress hot meanwhile.
void fabric_transport::impl::abandon(node_id peer, std::error_code why) {
  sessions.close(peer);  // the next frame starts a new handshake
  // Its handshake messages the provider has not taken go too: they wait in one queue for every
  // peer, and one the provider keeps refusing holds up the handshakes to live peers behind it.
  std::erase_if(handshakes_waiting, [&](std::uint64_t id) {
    const auto h = handshakes.find(id);
    if (h == handshakes.end() || h->second.peer != peer) return false;
    handshakes.erase(h);
    return true;
  });
  traffic.forget(peer);
  for (auto it = sends.begin(); it != sends.end();) {
    auto& st = it->second;
    if (st.peer != peer || st.orphaned) {
      ++it;
      continue;
    }
    post_done(std::move(st.done), why);
    if (st.issued) {
      st.orphaned = true;
      ++it;
    } else {
      if (st.mr) fi_close(&st.mr->fid);
      it = sends.erase(it);
    }
  }
  for (auto it = writes.begin(); it != writes.end();) {
    auto& w = it->second;
    if (w.peer != peer || w.orphaned) {
      ++it;
      continue;
    }
    post_done(std::move(w.done), why);
    if (w.in_flight > 0) {
      w.orphaned = true;
      w.error = why;
      ++it;
    } else {
      it = writes.erase(it);
    }
  }
}

/// A dead peer never takes what waits for it nor completes what it was given: after
/// `stall_timeout` without either, give up on it and report it lost, as a dropped link is.
void fabric_transport::impl::give_up_on_stalled_peers() {
  for (const auto& stalled : traffic.stalled(steady::now(), options.stall_timeout)) {
    log::warn(
        "fabric: node {} took nothing for {} ms ({} operation(s) waiting, {} in flight); giving up "
        "on it",
        stalled.peer, options.stall_timeout.count(), stalled.waiting, stalled.in_flight);
    ++counters.peers_stalled;
    abandon(stalled.peer, transport_errc::peer_stalled);
    report_peer_lost(stalled.peer, transport_errc::peer_stalled);
  }
}

}  // namespace ferry
