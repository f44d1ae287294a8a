#include "transport/tcp/tcp_transport.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>

#include "runtime/log.hpp"
#include "runtime/same_host.hpp"
#include "transport/errc.hpp"
#include "transport/tcp/tcp_link.hpp"

namespace ferry {
namespace {

namespace ip = asio::ip;
namespace wire = tcp_link;
using boost::system::error_code;

/// Refused connections that may wait at once for their peer to close; past it they are closed
/// right after the REFUSE, so that a flood of refused connections cannot pile up sockets.
constexpr std::size_t max_lingering_refusals = 64;

/// Refuses a connection before it has a link: REFUSE, then wait (bounded) for the peer to close
/// so that our close does not reset the connection before it read the reason. `lingering` counts
/// the connections waiting so, together.
void refuse_unlinked(ip::tcp::socket socket, transport_errc reason,
                     std::chrono::milliseconds linger,
                     const std::shared_ptr<std::size_t>& lingering) {
  if (*lingering >= max_lingering_refusals) {
    refuse_now(socket, reason);
    error_code ignored;
    socket.close(ignored);
    return;
  }
  struct state {
    ip::tcp::socket socket;
    asio::steady_timer timer;
    std::vector<std::byte> bytes;
    std::array<std::byte, 256> sink;
    std::shared_ptr<std::size_t> lingering;
    bool finished = false;
    void finish() {
      if (finished) return;
      finished = true;
      --*lingering;
      error_code ignored;
      timer.cancel(ignored);
      socket.close(ignored);
    }
    static void drain(const std::shared_ptr<state>& s) {
      s->socket.async_read_some(asio::buffer(s->sink), [s](const error_code& ec, std::size_t) {
        if (ec) return s->finish();
        state::drain(s);
      });
    }
  };
  auto executor = socket.get_executor();
  ++*lingering;
  auto s = std::make_shared<state>(state{std::move(socket),
                                         asio::steady_timer(executor),
                                         wire::encode_refuse(static_cast<std::uint16_t>(reason)),
                                         {},
                                         lingering});
  s->timer.expires_after(linger);
  s->timer.async_wait([s](const error_code& ec) {
    if (!ec) s->finish();
  });
  asio::async_write(s->socket, asio::buffer(s->bytes), [s](const error_code& ec, std::size_t) {
    if (ec) return s->finish();
    error_code ignored;
    s->socket.shutdown(ip::tcp::socket::shutdown_send, ignored);
    state::drain(s);
  });
}

}  // namespace

std::shared_ptr<tcp_transport> tcp_transport::make(event_loop& loop, node_id self,
                                                   tcp_options options) {
  return std::shared_ptr<tcp_transport>(new tcp_transport(loop, self, std::move(options)));
}

tcp_transport::tcp_transport(event_loop& loop, node_id self, tcp_options options)
    : loop_(loop),
      self_(self),
      options_(std::move(options)),
      regions_(self),
      handshake_budget_({.max_total = options_.max_unauthenticated,
                         .max_per_address = options_.max_unauthenticated_per_address,
                         .stale_after = options_.handshake_timeout_under_pressure}),
      refusal_timer_(loop.io()) {}

tcp_transport::~tcp_transport() {
  close();
}

std::string tcp_transport::local_address() const {
  if (!acceptor_ || !acceptor_->is_open()) return {};
  error_code ec;
  const auto e = acceptor_->local_endpoint(ec);
  return ec ? std::string{} : endpoint_text(e);
}

std::error_code tcp_transport::start(transport_events events) {
  if (open_) return errc::invalid_argument;
  if (!authenticated() && !options_.allow_unauthenticated) {
    log::error(
        "tcp {}: no job secret (FERRY_SECRET / FERRY_SECRET_FILE) and unauthenticated mode not "
        "allowed",
        self_);
    return transport_errc::unauthenticated;
  }
  if (authenticated() && options_.secret.size() < min_secret_bytes) {
    log::error("tcp {}: the job secret is shorter than {} bytes", self_, min_secret_bytes);
    return errc::invalid_argument;
  }
  error_code ec;
  const auto address = ip::make_address(options_.bind_host, ec);
  if (ec) return transport_errc::bad_address;
  const ip::tcp::endpoint endpoint(address, options_.port);
  acceptor_.emplace(loop_.io());
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    log::error("tcp {}: cannot listen on {}: {}", self_, endpoint_text(endpoint), ec.message());
    acceptor_.reset();
    return std::error_code(ec);
  }
  if (!address.is_loopback())
    log::info("tcp {}: listening beyond loopback on {}", self_, local_address());
  if (!authenticated()) log::warn("tcp {}: running WITHOUT authentication", self_);
  if (options_.same_host_copy) {
    // Under Yama ptrace_scope 1 only a process's ancestors may read it; our readers are peers.
    // Where Yama is absent this fails with EINVAL, and nothing needed it.
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    copier_ = std::make_unique<process_copier>(loop_, options_.copy_threads);
    pid_ = ::getpid();
    host_tag_ = same_host_tag();
    log::debug("tcp {}: same-host copies (cma) on {} threads", self_, copier_->threads());
  }
  events_ = std::move(events);
  open_ = true;
  accept_next();
  return {};
}

void tcp_transport::close() {
  if (!open_) return;
  open_ = false;
  if (acceptor_) {
    error_code ignored;
    acceptor_->close(ignored);
  }
  for (auto& [id, p] : peers_) {
    if (p.out) p.out->shut(errc::stopped);
    p.out.reset();
  }
  auto incoming = std::move(incoming_);
  incoming_.clear();
  handshaking_.clear();
  handshake_budget_.clear();
  for (const auto& l : incoming) l->shut(errc::stopped);
  // What the last second turned away is still news.
  error_code ignored;
  refusal_timer_.cancel(ignored);
  if (!refusals_.empty()) {
    log::warn("tcp {}: {}", self_, refusals_.take(std::chrono::steady_clock::now()));
  }
  // Copies into our regions stop here; their reports find their links closed.
  copier_.reset();
}

void tcp_transport::accept_next() {
  acceptor_->async_accept([weak = weak_from_this()](const error_code& ec, ip::tcp::socket socket) {
    auto self = weak.lock();
    if (!self || !self->open_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors and the like: back off rather than spin on a failing accept.
      log::warn("tcp {}: accept failed: {}", self->self_, ec.message());
      auto timer =
          std::make_shared<asio::steady_timer>(self->loop_.io(), std::chrono::milliseconds(100));
      timer->async_wait([weak, timer](const error_code&) {
        if (auto t = weak.lock(); t && t->open_) t->accept_next();
      });
      return;
    }
    self->on_accepted(std::move(socket));
    self->accept_next();
  });
}

void tcp_transport::on_accepted(ip::tcp::socket socket) {
  error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  socket.set_option(ip::tcp::no_delay(true), ec);
  const auto from = remote.address();
  // Links that proved the job secret are the job's own (one host may run dozens of its nodes),
  // bounded per node by max_links_per_node; the cap is for the rest.
  const auto same_address = static_cast<std::size_t>(std::count_if(
      incoming_.begin(), incoming_.end(),
      [&](const auto& l) { return l->remote_ip() == from && !(l->ready() && authenticated()); }));
  if (same_address >= options_.max_connections_per_address) {
    return refuse_connection(std::move(socket), from, "max_connections_per_address");
  }
  const auto now = std::chrono::steady_clock::now();
  const auto verdict = handshake_budget_.consider(from, now, [this](std::uint64_t id) {
    const auto it = handshaking_.find(id);
    return it != handshaking_.end() && it->second->spoke();
  });
  if (!verdict.admit) return refuse_connection(std::move(socket), from, verdict.limit);
  if (verdict.evict) {
    if (const auto it = handshaking_.find(*verdict.evict); it != handshaking_.end()) {
      auto victim = it->second->shared_from_this();
      ++stats_.connections_evicted;
      victim->evict(fmt::format("closed {} to make room ({})",
                                victim->spoke() ? "after handshaking too long" : "while idle",
                                verdict.limit));
    }
  }
  auto l = std::make_shared<link>(*this, false, std::move(socket), 0);
  const auto id = next_incoming_id_++;
  incoming_.insert(l);
  handshaking_.emplace(id, l.get());
  handshake_budget_.add(id, from, now);
  l->start_server(remote, id);
}

void tcp_transport::refuse_connection(ip::tcp::socket socket, const ip::address& from,
                                      std::string_view limit) {
  ++stats_.connections_refused;
  turned_away(from, fmt::format("refused: limit {} reached", limit));
  refuse_unlinked(std::move(socket), transport_errc::limit_exceeded, options_.handshake_timeout,
                  lingering_refusals_);
}

void tcp_transport::turned_away(const ip::address& from, std::string reason) {
  const auto now = std::chrono::steady_clock::now();
  if (refusals_.add(from.to_string(), reason, now)) {
    return log::warn("tcp {}: {}", self_, refusals_.take(now));
  }
  arm_refusal_timer();
}

void tcp_transport::arm_refusal_timer() {
  if (refusal_timer_armed_) return;
  refusal_timer_armed_ = true;
  refusal_timer_.expires_at(refusals_.due());
  refusal_timer_.async_wait([weak = weak_from_this()](const error_code& ec) {
    auto self = weak.lock();
    if (!self || ec) return;
    self->refusal_timer_armed_ = false;
    if (self->refusals_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    // A refusal may have written the line since this timer was armed: then the rest waits.
    if (now < self->refusals_.due()) return self->arm_refusal_timer();
    log::warn("tcp {}: {}", self->self_, self->refusals_.take(now));
  });
}

std::error_code tcp_transport::add_peer(node_id peer, std::string_view address) {
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return transport_errc::bad_address;
  auto host = address.substr(0, colon);
  const auto port_text = address.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return transport_errc::bad_address;
    host = host.substr(1, host.size() - 2);
  }
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return transport_errc::bad_address;
  }
  auto& entry = peers_[peer];
  entry.host = std::string(host);
  entry.port = static_cast<std::uint16_t>(port);
  return {};
}

void tcp_transport::remove_peer(node_id peer) {
  if (auto it = peers_.find(peer); it != peers_.end()) {
    if (it->second.out) it->second.out->shut(errc::stopped);
    peers_.erase(it);
  }
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    if ((*it)->ready() && (*it)->peer() == peer) {
      (*it)->shut(errc::stopped);
      it = incoming_.erase(it);
    } else {
      ++it;
    }
  }
}

std::shared_ptr<tcp_transport::link> tcp_transport::link_to(node_id peer) {
  if (peer == self_) return nullptr;
  auto it = peers_.find(peer);
  if (it == peers_.end()) return nullptr;
  auto& entry = it->second;
  if (!entry.out) {
    entry.out = std::make_shared<link>(*this, true, ip::tcp::socket(loop_.io()), peer);
    entry.out->start_client(entry.host, entry.port);
  }
  return entry.out;
}

void tcp_transport::post_done(completion done, std::error_code ec) {
  loop_.post([done = std::move(done), ec] { done(ec); });
}

void tcp_transport::async_send(node_id to, frame f, completion done) {
  if (!open_) return post_done(std::move(done), errc::stopped);
  if (f.size() <= frame_prefix_bytes) return post_done(std::move(done), errc::malformed_frame);
  if (f.size() - frame_prefix_bytes > options_.limits.max_frame_bytes) {
    return post_done(std::move(done), errc::oversize_frame);
  }
  auto l = link_to(to);
  if (!l) return post_done(std::move(done), transport_errc::peer_unreachable);
  l->enqueue_control(std::move(f), std::move(done));
}

result<region_desc> tcp_transport::register_region(std::span<std::byte> memory) {
  return regions_.add(memory);
}
void tcp_transport::deregister_region(std::uint64_t region_id) {
  regions_.remove(region_id);
  // A payload still being read into it would land in memory its owner may free next.
  drop_mid_payload([region_id](const link& l) { return l.payload_region_ == region_id; },
                   "its region was deregistered mid-payload");
  // So would a same-host copy: one running is waited for (a piece is tens of milliseconds at
  // most), those queued are skipped and acked as failed.
  if (copier_) copier_->forget_region(region_id);
}

void tcp_transport::drop_mid_payload(const std::function<bool(const link&)>& which,
                                     std::string_view why) {
  std::vector<std::shared_ptr<link>> dropped;  // apart: a drop leaves `incoming_`
  for (const auto& l : incoming_)
    if (l->payload_region_ && which(*l)) dropped.push_back(l);
  for (const auto& l : dropped) l->drop(transport_errc::connection_lost, why);
}
// A write whose header came before is refused from its next piece on (`read_payload`); a
// same-host copy already running finishes.
result<region_desc> tcp_transport::rekey_region(std::uint64_t region_id) {
  return regions_.rekey(region_id);
}

bool tcp_transport::when_writes_end(std::uint64_t region_id, std::function<void()> done) {
  // Later on the loop, not inside the handling of the write that ended last.
  return regions_.when_writes_end(region_id,
                                  [&loop = loop_, done = std::move(done)] { loop.post(done); });
}

void tcp_transport::async_write(std::span<const std::byte> local, const region_desc& remote,
                                std::uint64_t offset, write_imm imm, completion done) {
  if (!open_) return post_done(std::move(done), errc::stopped);
  if (!regions_.contains(local)) return post_done(std::move(done), transport_errc::not_registered);
  auto l = link_to(remote.owner);
  if (!l) return post_done(std::move(done), transport_errc::peer_unreachable);
  const tcp_link::write_header h{.region = remote.id,
                                 .key = remote.key,
                                 .offset = offset,
                                 .length = local.size(),
                                 .imm = imm,
                                 .id = next_write_id_++};
  if (options_.same_host_copy) {
    return l->enqueue_local_write({.write = h,
                                   .pid = static_cast<std::uint32_t>(pid_),
                                   .source = reinterpret_cast<std::uintptr_t>(local.data()),
                                   .host = host_tag_},
                                  std::move(done));
  }
  l->enqueue_write(h, local, std::move(done));
}

void tcp_transport::on_link_ready(link& l) {
  if (l.outgoing()) {
    log::debug("tcp {}: link to node {} at {} is up", self_, l.peer(), l.remote());
    return;
  }
  handshaking_.erase(l.incoming_id());
  handshake_budget_.remove(l.incoming_id());
  ++stats_.links_accepted;
  log::debug("tcp {}: accepted node {} from {}", self_, l.peer(), l.remote());
  // A node opens another link only once its end of the last one failed (a crash, a cut): a
  // payload an older link is still reading will never be finished, and would hold up whoever
  // waits for its region's writes to end (`when_writes_end`).
  drop_mid_payload([&l](const link& o) { return &o != &l && o.ready() && o.peer() == l.peer(); },
                   "a newer link from its node replaced it mid-payload");
}

void tcp_transport::on_link_lost(const std::shared_ptr<link>& l, std::error_code why) {
  const bool was_ready = l->ready();
  const bool handshaking = l->handshaking();
  const auto detail = l->detail_;
  l->shut(why);
  if (l->outgoing()) {
    if (auto it = peers_.find(l->peer()); it != peers_.end() && it->second.out == l)
      it->second.out.reset();
  } else if (incoming_.erase(l) > 0 && !was_ready) {
    handshaking_.erase(l->incoming_id());
    handshake_budget_.remove(l->incoming_id());
  }
  if (why == transport_errc::protocol_violation) ++stats_.protocol_violations;
  if (was_ready) {
    ++stats_.links_lost;
  } else if (handshaking && !l->refused_by_limit()) {
    ++stats_.handshakes_failed;
  }
  if (!l->outgoing() && !was_ready) {
    // Anyone can open connections: what fails before the proof is summed up, not logged each.
    // A limit's own words say it all; other failures say what failed, then the detail.
    turned_away(l->remote_ip(), detail.empty()          ? why.message()
                                : l->refused_by_limit() ? detail
                                                        : why.message() + ": " + detail);
  } else {
    // A link that simply closed between frames is the node's news to tell ("lost peer", or
    // nothing at a job's end); one the peer broke or cut mid-frame is ours.
    const bool closed_cleanly =
        was_ready && why == transport_errc::connection_lost && !detail.starts_with(mid_frame);
    const auto level = closed_cleanly ? log::level::debug : log::level::warn;
    if (log::threshold() <= level)
      log::write(level,
                 fmt::format("tcp {}: dropped {} link {} node {} ({}): {}{}{}", self_,
                             l->outgoing() ? "outgoing" : "incoming", l->outgoing() ? "to" : "from",
                             l->peer(), l->remote().empty() ? "?" : l->remote(), why.message(),
                             detail.empty() ? "" : ": ", detail));
  }
  // An incoming link's clean loss is reported by our own link to that peer, which breaks too.
  const bool report = was_ready && (l->outgoing() || why == transport_errc::protocol_violation);
  if (report && events_.on_peer_lost) events_.on_peer_lost(l->peer(), why);
}

std::string local_host_toward(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return {};
  auto host = address.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  asio::io_context io;
  error_code ec;
  ip::tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, address.substr(colon + 1), ec);
  if (ec || found.empty()) return {};
  // A "connected" UDP socket sends nothing: the kernel only picks the route, and its source.
  const auto target = found.begin()->endpoint();
  ip::udp::socket probe(io);
  probe.connect(ip::udp::endpoint(target.address(), target.port()), ec);
  if (ec) return {};
  const auto local = probe.local_endpoint(ec);
  return ec ? std::string{} : local.address().to_string();
}

}  // namespace ferry
