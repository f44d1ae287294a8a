#include "transport/fabric/fabric_transport.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "runtime/log.hpp"
#include "transport/errc.hpp"
#include "transport/fabric/fabric_impl.hpp"

namespace ferry {
namespace {

/// Completions handled per turn, so one busy transport cannot starve the loop.
constexpr int drain_budget = 256;

}  // namespace

using fabric_link::fi_error_text;

fabric_transport::impl::impl(event_loop& l, node_id s, fabric_options o)
    : loop(l),
      self(s),
      options(std::move(o)),
      sessions(options.secret, s),
      assembly(options.max_frame) {}

// ---- opening and closing -------------------------------------------------------------------

std::error_code fabric_transport::impl::open() {
  auto opened = fabric_link::endpoint::open(options);
  if (!opened) return opened.error();
  provider = std::move(*opened);
  name_hex = fabric_link::hex_encode(provider->name);
  const std::size_t slot = rx_slot();
  rx_slab = std::make_unique<std::byte[]>(slot * options.rx_buffers);
  if (provider->mr_mode & FI_MR_LOCAL) {
    if (auto ec =
            provider->register_memory(rx_slab.get(), slot * options.rx_buffers, FI_RECV, rx_mr))
      return ec;
  }
  for (std::size_t i = 0; i < options.rx_buffers; ++i) rx_ops.push_back(ops.take(op_kind::recv, i));
  auto weak = weak_from_this();
  progress = std::make_shared<fabric_link::progress_driver>(
      loop, provider->wait_fd,
      fabric_link::progress_driver::hooks{.drain =
                                              [weak] {
                                                auto s = weak.lock();
                                                return s ? s->drain() : 0;
                                              },
                                          .busy =
                                              [weak] {
                                                auto s = weak.lock();
                                                return s && s->busy();
                                              },
                                          .may_sleep =
                                              [weak] {
                                                auto s = weak.lock();
                                                return s && s->provider->may_sleep();
                                              }});
  log::debug("fabric: node {} opened provider {} (mr_mode {:#x}, max piece {}, progress {}{})",
             self, provider->provider_name, provider->mr_mode, provider->max_piece,
             progress->has_wait_fd() ? "wait-fd" : "timer",
             provider->inject_only ? ", inject only" : "");
  return {};
}

/// Opens the peer watch beside the endpoint; without one (no tcp on `options.node`), deaths are
/// found by the heartbeat's timeout and the stall detector.
void fabric_transport::impl::open_watch() {
  if (!options.watch_peers) return;
  watch =
      peer_watch::make(loop.io(), self, options.secret, [weak = weak_from_this()](node_id peer) {
        if (auto self_ = weak.lock()) self_->peer_ended(peer);
      });
  const std::string host = provider->provider_name == "shm" ? "127.0.0.1" : options.node;
  if (auto ec = watch->listen(host)) {
    log::warn(
        "fabric: node {} cannot watch its peers over tcp on '{}' ({}): a death is found at the "
        "heartbeat's "
        "timeout",
        self, host, ec.message());
    watch.reset();
  }
}

/// The watch saw `peer`'s process end: it is lost, as a tcp link's end says.
void fabric_transport::impl::peer_ended(node_id peer) {
  if (closed || !peers.contains(peer)) return;
  log::debug("fabric: node {}: the process of node {} ended", self, peer);
  abandon(peer, transport_errc::connection_lost);
  report_peer_lost(peer, transport_errc::connection_lost);
}

void fabric_transport::impl::shutdown() {
  if (closed) return;
  closed = true;
  running = false;
  if (watch) watch->close();
  if (progress) progress->stop();
  if (provider) provider->close_endpoint();
  fail_everything_in_flight();
  for (auto& [id, r] : regions)
    if (r.mr) fi_close(&r.mr->fid);
  regions.clear();
  by_base.clear();
  if (rx_mr) fi_close(&rx_mr->fid);
  rx_mr = nullptr;
  if (provider) provider->close();
}

/// The endpoint is gone, so nothing in flight completes any more: fail it all, once.
void fabric_transport::impl::fail_everything_in_flight() {
  for (auto& [id, s] : sends) {
    if (s.mr) fi_close(&s.mr->fid);
    if (!s.orphaned && s.done) post_done(std::move(s.done), errc::stopped);
  }
  sends.clear();
  for (auto& [id, w] : writes) {
    if (!w.orphaned && w.done) post_done(std::move(w.done), errc::stopped);
  }
  writes.clear();
  traffic.clear();
  rx_waiting.clear();
  handshakes.clear();
  handshakes_waiting.clear();
}

void fabric_transport::impl::post_done(completion done, std::error_code ec) {
  if (!done) return;
  loop.post([done = std::move(done), ec] { done(ec); });
}

void fabric_transport::impl::report_peer_lost(node_id peer, std::error_code why) {
  if (!events.on_peer_lost) return;
  loop.post([weak = weak_from_this(), peer, why] {
    if (auto self_ = weak.lock(); self_ && self_->running && self_->events.on_peer_lost)
      self_->events.on_peer_lost(peer, why);
  });
}

// ---- completions ---------------------------------------------------------------------------

/// Reads completions (which also drives the provider's progress) and retries waiting ops.
int fabric_transport::impl::drain() {
  if (!running) return 0;
  auto keep = shared_from_this();  // a callback may drop the last owner of the transport
  int handled = 0;
  fi_cq_data_entry entries[16];
  while (running && handled < drain_budget) {
    const ssize_t n = fi_cq_read(provider->cq, entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n && running; ++i) handle_entry(entries[i]);
      handled += static_cast<int>(n);
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(provider->cq, &err, 0) > 0) handle_error(err);
      ++handled;
      continue;
    }
    if (n != -FI_EAGAIN)
      log::error("fabric: fi_cq_read failed: {}", fi_error_text(static_cast<int>(n)));
    break;
  }
  if (running) retry_waiting();
  if (running) give_up_on_stalled_peers();
  return handled;
}

void fabric_transport::impl::handle_entry(const fi_cq_data_entry& e) {
  auto* o = static_cast<op*>(e.op_context);
  if (e.flags & FI_REMOTE_CQ_DATA && (e.flags & FI_REMOTE_WRITE || !(e.flags & FI_MSG))) {
    on_remote_write(e);
    // Under FI_RX_CQ_DATA a write with data consumed one of our receive buffers.
    if (o && o->kind == op_kind::recv) repost_rx(o->owner);
    return;
  }
  if (!o) return;
  switch (o->kind) {
    case op_kind::recv:
      on_message(o->owner, e.len);
      if (running) repost_rx(o->owner);
      break;
    case op_kind::send:
      on_send_done(o, {});
      break;
    case op_kind::write:
      on_piece_done(o, {});
      break;
    case op_kind::handshake:
      handshakes.erase(o->owner);
      ops.give(o);
      break;
  }
}

void fabric_transport::impl::handle_error(const fi_cq_err_entry& e) {
  auto* o = static_cast<op*>(e.op_context);
  const auto ec = fabric_link::map_op_error(e.err);
  if (!o) {
    // A remote operation failed at this target (e.g. a write with a bad key): count it.
    ++counters.writes_refused;
    log::warn("fabric: remote operation failed here: {}", fi_error_text(e.err));
    return;
  }
  switch (o->kind) {
    case op_kind::recv:
      ++counters.frames_rejected;
      log::warn("fabric: dropped a control frame ({}; {} bytes over the {}-byte limit?)",
                fi_error_text(e.err), e.olen, options.max_frame);
      if (running) repost_rx(o->owner);
      break;
    case op_kind::send:
      log::warn("fabric: control frame failed: {}", fi_error_text(e.err));
      on_send_done(o, ec);
      break;
    case op_kind::write:
      log::warn("fabric: write failed: {} (provider errno {})", fi_error_text(e.err), e.prov_errno);
      on_piece_done(o, ec);
      break;
    case op_kind::handshake:
      log::debug("fabric: a handshake message failed: {}", fi_error_text(e.err));
      handshakes.erase(o->owner);
      ops.give(o);
      break;
  }
}

/// The region that holds all of `local`, if we registered one.
const fabric_transport::impl::region* fabric_transport::impl::region_holding(
    std::span<const std::byte> local) const {
  auto it = by_base.upper_bound(local.data());
  if (it == by_base.begin()) return nullptr;
  const auto& r = regions.at(std::prev(it)->second);
  return local.data() + local.size() <= r.memory.data() + r.memory.size() ? &r : nullptr;
}

// ---- fabric_transport ----------------------------------------------------------------------

result<std::shared_ptr<fabric_transport>> fabric_transport::make(event_loop& loop, node_id self,
                                                                 fabric_options options) {
  if (options.max_frame < frame_prefix_bytes + 1 || options.max_frame > fabric_link::length_mask ||
      options.rx_buffers == 0)
    return fail(errc::invalid_argument);
  auto state = std::make_shared<impl>(loop, self, std::move(options));
  if (auto ec = state->open()) return fail(ec);
  state->open_watch();
  return std::shared_ptr<fabric_transport>(new fabric_transport(std::move(state)));
}

fabric_transport::fabric_transport(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

fabric_transport::~fabric_transport() {
  close();
}

std::string fabric_transport::local_address() const {
  return impl_->watch ? impl_->name_hex + "@" + impl_->watch->address() : impl_->name_hex;
}
std::string fabric_transport::provider() const {
  return impl_->provider->provider_name;
}

result<region_desc> fabric_transport::register_device_region(std::span<std::byte>, int device,
                                                             std::string& why) {
  // A provider with FI_HMEM would take GPU memory through fi_mr_regattr (iface FI_HMEM_CUDA); no
  // run has exercised that yet, and a path no run has exercised is not offered.
  why = fmt::format(
      "libfabric provider '{}': ferry registers no GPU memory with libfabric yet (GPUDirect RDMA, "
      "FI_HMEM), so GPU {} is reached through host memory",
      impl_->provider->provider_name, device);
  return fail(errc::invalid_argument);
}
std::string_view fabric_transport::progress_mode() const {
  return impl_->progress->has_wait_fd() ? "wait-fd" : "timer";
}
const fabric_stats& fabric_transport::stats() const {
  return impl_->counters;
}

std::error_code fabric_transport::start(transport_events events) {
  auto& s = *impl_;
  if (s.closed) return errc::stopped;
  if (s.running) return {};
  if (!s.sealed() && !s.options.allow_unauthenticated) {
    log::warn("fabric: node {} has no job secret (set one, or allow unauthenticated links)",
              s.self);
    return transport_errc::unauthenticated;
  }
  s.events = std::move(events);
  s.running = true;
  for (std::size_t i = 0; i < s.rx_ops.size(); ++i) s.repost_rx(i);
  s.progress->start();
  return {};
}

void fabric_transport::close() {
  impl_->shutdown();
}

std::error_code fabric_transport::add_peer(node_id peer, std::string_view address) {
  auto& s = *impl_;
  if (s.closed) return errc::stopped;
  const auto at = address.find('@');  // the endpoint's name, then its watch's host:port
  auto blob = fabric_link::hex_decode(address.substr(0, at));
  if (!blob) return blob.error();
  if (auto it = s.peers.find(peer); it != s.peers.end()) {
    s.provider->remove(it->second);
    s.peers.erase(it);
    // Another process under the same id: what was outstanding for the old one fails, and the
    // link to the new one starts with a new handshake.
    if (s.peer_names[peer] != *blob) s.abandon(peer, transport_errc::connection_lost);
  }
  const auto addr = s.provider->insert(*blob);
  if (!addr) {
    log::warn("fabric: fi_av_insert for node {} failed", peer);
    return transport_errc::bad_address;
  }
  s.peers[peer] = *addr;
  s.peer_names[peer] = std::move(*blob);
  if (s.watch && at != std::string_view::npos) s.watch->watch(peer, address.substr(at + 1));
  return {};
}

void fabric_transport::remove_peer(node_id peer) {
  auto& s = *impl_;
  auto it = s.peers.find(peer);
  if (it == s.peers.end()) return;
  s.abandon(peer, transport_errc::peer_unreachable);
  s.assembly.forget(peer);
  s.sessions.close(peer);
  s.release_temporary(peer);
  s.sessions.drop_pending(peer);
  s.provider->remove(it->second);
  s.peers.erase(it);
  s.peer_names.erase(peer);
  if (s.watch) s.watch->forget(peer);
}

void fabric_transport::async_send(node_id to, frame f, completion done) {
  auto& s = *impl_;
  if (!s.running) return s.post_done(std::move(done), errc::stopped);
  auto peer = s.peers.find(to);
  if (peer == s.peers.end()) return s.post_done(std::move(done), transport_errc::peer_unreachable);
  if (f.size() < frame_prefix_bytes) return s.post_done(std::move(done), errc::invalid_argument);
  if (f.size() > s.options.max_frame) return s.post_done(std::move(done), errc::oversize_frame);
  // The CQ entry has the length, so the prefix carries our node id instead; the length moves
  // to a trailer, which exposes a truncated message.
  const auto payload = f.size() - frame_prefix_bytes;
  f.resize(payload + s.overhead(impl::message_kind::frame));
  s.frame_message(f.data(), payload, impl::message_kind::frame);
  const auto id = s.next_op_id++;
  auto& st = s.sends[id];
  st.bytes = std::move(f);
  st.done = std::move(done);
  st.peer = to;
  st.addr = peer->second;
  if (s.provider->mr_mode & FI_MR_LOCAL) {
    if (auto ec = s.provider->register_memory(st.bytes.data(), st.bytes.size(), FI_SEND, st.mr)) {
      auto d = std::move(st.done);
      s.sends.erase(id);
      return s.post_done(std::move(d), ec);
    }
  }
  if (s.must_wait(to) || !s.issue_send(id)) s.enqueue(to, {impl::waiting_op::kind::send, id});
  s.progress->poke();
}

result<region_desc> fabric_transport::register_region(std::span<std::byte> memory) {
  auto& s = *impl_;
  if (s.closed) return fail(errc::stopped);
  if (memory.empty()) return fail(errc::invalid_argument);
  impl::region r;
  r.id = s.next_region++;
  r.memory = memory;
  std::error_code ec;
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::uint64_t key = 0;
    if (!(s.provider->mr_mode & FI_MR_PROV_KEY)) {
      key = s.keys();
      const auto bits = 8 * s.provider->info->domain_attr->mr_key_size;
      if (bits > 0 && bits < 64) key &= (std::uint64_t{1} << bits) - 1;
    }
    ec = s.provider->register_memory(memory.data(), memory.size(), FI_REMOTE_WRITE | FI_WRITE, r.mr,
                                     key);
    if (!ec) break;
  }
  if (ec) return fail(ec);
  r.desc = fi_mr_desc(r.mr);
  r.key = fi_mr_key(r.mr);
  const region_desc desc{.owner = s.self,
                         .id = r.id,
                         .addr = (s.provider->mr_mode & FI_MR_VIRT_ADDR)
                                     ? reinterpret_cast<std::uint64_t>(memory.data())
                                     : 0,
                         .key = r.key,
                         .length = memory.size()};
  s.by_base[memory.data()] = r.id;
  s.regions.emplace(r.id, r);
  return desc;
}

void fabric_transport::deregister_region(std::uint64_t region_id) {
  auto& s = *impl_;
  auto it = s.regions.find(region_id);
  if (it == s.regions.end()) return;
  if (it->second.mr) fi_close(&it->second.mr->fid);
  // The same memory may have been registered again meanwhile (a new key for it): only this
  // region's entry goes.
  if (auto base = s.by_base.find(it->second.memory.data());
      base != s.by_base.end() && base->second == region_id)
    s.by_base.erase(base);
  s.regions.erase(it);
}

void fabric_transport::async_write(std::span<const std::byte> local, const region_desc& remote,
                                   std::uint64_t offset, write_imm imm, completion done) {
  auto& s = *impl_;
  auto refuse = [&](std::error_code ec) {
    ++s.counters.writes_refused;
    s.post_done(std::move(done), ec);
  };
  if (!s.running) return s.post_done(std::move(done), errc::stopped);
  auto peer = s.peers.find(remote.owner);
  if (peer == s.peers.end()) return refuse(transport_errc::peer_unreachable);
  // The peer's provider checks key and range too; checking the length here refuses the
  // common mistake before anything is sent.
  if (offset > remote.length || local.size() > remote.length - offset)
    return refuse(transport_errc::out_of_bounds);
  const impl::region* src = s.region_holding(local);
  if (!src) return refuse(transport_errc::not_registered);

  const auto id = s.next_op_id++;
  auto& w = s.writes[id];
  w.done = std::move(done);
  w.peer = remote.owner;
  w.addr = peer->second;
  w.src = local.data();
  w.length = local.size();
  w.desc = src->desc;
  w.remote_addr = remote.addr + offset;
  w.key = remote.key;
  w.imm = imm;
  // Everything but the last piece goes first without data; the last carries the immediate
  // once the rest has landed, so the receiver's notice means the whole write is there.
  const auto piece = s.provider->max_piece;
  w.body_end = w.length > piece ? w.length - ((w.length - 1) % piece + 1) : 0;
  if (s.provider->inject_only) w.body_end = w.length;
  if (s.must_wait(remote.owner) || !s.pump_write(id)) {
    if (auto it = s.writes.find(id); it != s.writes.end()) {
      it->second.queued = true;
      s.enqueue(remote.owner, {impl::waiting_op::kind::write, id});
    }
  }
  s.progress->poke();
}

std::size_t remove_shm_regions_of(pid_t pid) {
  const auto prefix = std::to_string(pid) + ":" + std::to_string(getuid()) + ":";
  std::size_t removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/dev/shm", ec), end; !ec && it != end;
       it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size() ||
        !std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::error_code gone;
    removed += std::filesystem::remove(it->path(), gone);
  }
  return removed;
}

}  // namespace ferry
