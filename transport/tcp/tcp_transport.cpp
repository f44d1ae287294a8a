#include "transport/tcp/tcp_transport.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <deque>

#include "runtime/log.hpp"
#include "runtime/same_host.hpp"
#include "transport/errc.hpp"
#include "transport/tcp/link_protocol.hpp"

namespace ferry {
namespace {

namespace ip = asio::ip;
namespace wire = tcp_link;
using boost::system::error_code;

/// Lets one read or write system call move up to 4 MiB instead of Asio's default 64 KiB.
struct large_transfers {
  std::size_t operator()(const error_code& ec, std::size_t) const {
    return ec ? 0 : std::size_t{4} << 20;
  }
};

/// A write's payload is read into its region by pieces of this size, its key checked before each.
constexpr std::uint64_t payload_piece = std::uint64_t{4} << 20;

/// The start of a lost link's detail when the stream ended inside a frame.
const std::string mid_frame = "mid-frame: ";

/// The error a peer's REFUSE or WRITE_ACK names; anything we do not know is a protocol violation.
std::error_code refusal_error(std::uint16_t reason) {
  if (reason >= 1 && reason <= static_cast<std::uint16_t>(transport_errc::not_same_host) &&
      reason != static_cast<std::uint16_t>(transport_errc::peer_stalled)) {
    if (reason == static_cast<std::uint16_t>(transport_errc::not_same_host))
      return errc::not_same_host;
    return static_cast<transport_errc>(reason);
  }
  return transport_errc::protocol_violation;
}

std::string endpoint_text(const ip::tcp::endpoint& e) {
  const auto a = e.address();
  return a.is_v6() ? "[" + a.to_string() + "]:" + std::to_string(e.port())
                   : a.to_string() + ":" + std::to_string(e.port());
}

/// Refused connections that may wait at once for their peer to close; past it they are closed
/// right after the REFUSE, so that a flood of refused connections cannot pile up sockets.
constexpr std::size_t max_lingering_refusals = 64;

/// Writes REFUSE without waiting: a best effort for connections closed at once.
void refuse_now(ip::tcp::socket& socket, transport_errc reason) {
  const auto bytes = wire::encode_refuse(static_cast<std::uint16_t>(reason));
  error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
  socket.shutdown(ip::tcp::socket::shutdown_send, ignored);
}

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

/// One TCP connection. Outgoing links carry our control frames and writes to `peer_` and read
/// its acks; incoming links read a peer's frames and writes and send acks back. Every handler
/// holds the link alive and returns at once when it was closed, so nothing runs after `shut`.
class tcp_transport::link : public std::enable_shared_from_this<link> {
 public:
  enum class phase { connecting, handshaking, ready, closed };

  link(tcp_transport& owner, bool outgoing, ip::tcp::socket socket, node_id peer)
      : owner_(&owner),
        io_(owner.loop_.io()),
        outgoing_(outgoing),
        socket_(std::move(socket)),
        timer_(owner.loop_.io()),
        peer_(peer) {}

  bool outgoing() const { return outgoing_; }
  node_id peer() const { return peer_; }
  bool ready() const { return phase_ == phase::ready; }
  bool handshaking() const { return phase_ == phase::handshaking; }
  bool closed() const { return phase_ == phase::closed; }
  bool refused_by_limit() const { return refused_by_limit_; }
  /// Incoming links: their id in the owner's handshake budget.
  std::uint64_t incoming_id() const { return incoming_id_; }
  /// Incoming links: whether the peer has sent its first frame, or has bytes waiting to be read.
  bool spoke() const {
    error_code ec;
    return spoke_ || socket_.available(ec) > 0;
  }
  const std::string& remote() const { return remote_; }
  const ip::address& remote_ip() const { return remote_ip_; }

  void start_client(const std::string& host, std::uint16_t port) {
    arm_timer();
    auto self = shared_from_this();
    auto on_connected = [self](const error_code& ec) {
      if (self->closed()) return;
      if (ec) return self->drop(transport_errc::peer_unreachable, ec.message());
      self->connected();
    };
    error_code ec;
    const auto address = ip::make_address(host, ec);
    if (!ec) return socket_.async_connect(ip::tcp::endpoint(address, port), on_connected);
    // Names go through the resolver, which runs getaddrinfo on Asio's private thread.
    resolver_ = std::make_unique<ip::tcp::resolver>(io_);
    resolver_->async_resolve(
        host, std::to_string(port),
        [self, on_connected](const error_code& rec, ip::tcp::resolver::results_type results) {
          if (self->closed()) return;
          if (rec) return self->drop(transport_errc::peer_unreachable, rec.message());
          asio::async_connect(self->socket_, results,
                              [on_connected](const error_code& cec, const ip::tcp::endpoint&) {
                                on_connected(cec);
                              });
        });
  }

  void start_server(const ip::tcp::endpoint& remote, std::uint64_t incoming_id) {
    incoming_id_ = incoming_id;
    remote_ = endpoint_text(remote);
    remote_ip_ = remote.address();
    phase_ = phase::handshaking;
    arm_timer();
    auto self = shared_from_this();
    read_handshake([self](wire::frame_type type, std::span<const std::byte> body) {
      self->spoke_ = true;
      self->on_hello(type, body);
    });
  }

  void enqueue_control(frame f, completion sent) {
    out_item item;
    const auto head = wire::make_head(wire::frame_type::control, f.size() - frame_prefix_bytes);
    item.head.assign(head.begin(), head.end());
    item.keep = std::move(f);
    item.body = std::span<const std::byte>(item.keep).subspan(frame_prefix_bytes);
    item.sent = std::move(sent);
    queue_.push_back(std::move(item));
    flush();
  }

  void enqueue_write(const wire::write_header& h, std::span<const std::byte> payload,
                     completion done) {
    pending_writes_.emplace(h.id, std::move(done));
    out_item item;
    item.head = wire::encode(h);
    item.body = payload;
    queue_.push_back(std::move(item));
    flush();
  }

  /// Same-host mode: the header alone; the peer copies the bytes out of our memory.
  void enqueue_local_write(const wire::local_write_header& h, completion done) {
    pending_writes_.emplace(h.write.id, std::move(done));
    out_item item;
    item.head = wire::encode(h);
    queue_.push_back(std::move(item));
    flush();
  }

  /// Closes a link in its handshake to make room for a newcomer: REFUSE(limit_exceeded) without
  /// waiting, then the owner drops it like any failed handshake, saying `detail`.
  void evict(std::string detail) {
    if (closed()) return;
    refused_by_limit_ = true;
    refuse_now(socket_, transport_errc::limit_exceeded);
    drop(transport_errc::limit_exceeded, detail);
  }

  /// Closes the link; everything pending completes with `why`, later, on the loop.
  void shut(std::error_code why) {
    if (closed()) return;
    phase_ = phase::closed;
    error_code ignored;
    timer_.cancel(ignored);
    if (resolver_) resolver_->cancel();
    socket_.shutdown(ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    std::vector<completion> done;
    for (auto& item : inflight_) {
      if (item.sent) done.push_back(std::move(item.sent));
    }
    for (auto& item : queue_) {
      if (item.sent) done.push_back(std::move(item.sent));
    }
    for (auto& [id, d] : pending_writes_) done.push_back(std::move(d));
    inflight_.clear();
    queue_.clear();
    pending_writes_.clear();
    end_payload();
    owner_ = nullptr;
    for (auto& d : done) asio::post(io_, [d = std::move(d), why] { d(why); });
  }

 private:
  struct out_item {
    std::vector<std::byte> head;
    std::span<const std::byte> body;  ///< written after head without a copy
    frame keep;                       ///< owns `body` for control frames
    completion sent;                  ///< control frames: runs when the frame left
  };
  using frame_handler = std::function<void(wire::frame_type, std::span<const std::byte>)>;

  tcp_transport& owner() { return *owner_; }
  wire::auth_mode auth() const {
    return owner_->authenticated() ? wire::auth_mode::hmac_sha256 : wire::auth_mode::none;
  }

  void arm_timer() {
    timer_.expires_after(owner().options_.handshake_timeout);
    auto self = shared_from_this();
    timer_.async_wait([self](const error_code& ec) {
      if (ec || self->closed() || self->ready()) return;
      self->drop(errc::timed_out, "handshake did not finish in time");
    });
  }

  /// Asks the owner to drop this link (it calls `shut`) and report it.
  void drop(std::error_code why, std::string_view detail = {}) {
    if (closed()) return;
    detail_ = detail;
    owner().on_link_lost(shared_from_this(), why);
  }

  void violation(std::string_view what) { drop(transport_errc::protocol_violation, what); }

  /// Sends REFUSE with `reason`, then drops the link.
  void refuse(transport_errc reason, std::string detail) {
    auto self = shared_from_this();
    send_handshake(wire::encode_refuse(static_cast<std::uint16_t>(reason)),
                   [self, reason, detail] { self->drop(reason, detail); });
  }

  void send_handshake(std::vector<std::byte> bytes, std::function<void()> then) {
    auto buffer = std::make_shared<std::vector<std::byte>>(std::move(bytes));
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(*buffer),
                      [self, buffer, then](const error_code& ec, std::size_t) {
                        if (self->closed()) return;
                        if (ec) return self->drop(transport_errc::connection_lost, ec.message());
                        then();
                      });
  }

  void read_handshake(frame_handler next) {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(head_), [self, next](const error_code& ec, std::size_t) {
      if (self->closed()) return;
      if (ec) return self->drop(transport_errc::connection_lost, ec.message());
      const auto h = wire::parse_head(self->head_);
      if (!h || h->length - 1 > wire::challenge_bytes)
        return self->violation("oversize or empty handshake frame");
      self->body_.resize(h->length - 1);
      asio::async_read(self->socket_, asio::buffer(self->body_),
                       [self, next, type = h->type](const error_code& bec, std::size_t) {
                         if (self->closed()) return;
                         if (bec) return self->drop(transport_errc::connection_lost, bec.message());
                         next(static_cast<wire::frame_type>(type), self->body_);
                       });
    });
  }

  // Client side of the handshake.

  void connected() {
    error_code ec;
    socket_.set_option(ip::tcp::no_delay(true), ec);
    const auto remote = socket_.remote_endpoint(ec);
    if (!ec) {
      remote_ = endpoint_text(remote);
      remote_ip_ = remote.address();
    }
    phase_ = phase::handshaking;
    client_.emplace(owner().self_, peer_);
    auto self = shared_from_this();
    send_handshake(
        wire::encode(wire::hello{auth(), owner().self_, peer_, client_->nonce()}), [self] {
          self->read_handshake([self](wire::frame_type type, std::span<const std::byte> body) {
            self->on_challenge(type, body);
          });
        });
  }

  void on_challenge(wire::frame_type type, std::span<const std::byte> body) {
    if (type == wire::frame_type::refuse) return on_refused(body);
    if (type != wire::frame_type::challenge) return violation("expected CHALLENGE");
    const auto c = wire::parse_challenge(body);
    if (!c) return violation("malformed CHALLENGE");
    if (c->auth != auth())
      return refuse(transport_errc::unauthenticated, "authentication modes differ");
    if (c->from != peer_) {
      return refuse(transport_errc::unauthenticated,
                    fmt::format("the listener is node {}, not {}", c->from, peer_));
    }
    link_proof mine{};
    if (auth() == wire::auth_mode::hmac_sha256) {
      const auto answer = client_->answer(owner().options_.secret, c->nonce, c->proof);
      if (!answer)
        return refuse(transport_errc::unauthenticated, "the listener does not hold the job secret");
      mine = *answer;
    }
    auto self = shared_from_this();
    send_handshake(wire::encode_proof(mine), [self] {
      self->read_handshake(
          [self](wire::frame_type t, std::span<const std::byte> b) { self->on_accept(t, b); });
    });
  }

  void on_accept(wire::frame_type type, std::span<const std::byte> body) {
    if (type == wire::frame_type::refuse) return on_refused(body);
    if (type != wire::frame_type::accept || !body.empty()) return violation("expected ACCEPT");
    became_ready();
  }

  void on_refused(std::span<const std::byte> body) {
    const auto reason = wire::parse_refuse(body);
    if (!reason) return violation("malformed REFUSE");
    drop(refusal_error(*reason), "refused by the peer");
  }

  // Server side of the handshake.

  void on_hello(wire::frame_type type, std::span<const std::byte> body) {
    if (type != wire::frame_type::hello) return violation("expected HELLO");
    const auto h = wire::parse_hello(body);
    if (!h) return violation("malformed HELLO");
    peer_ = h->from;
    if (h->auth != auth())
      return refuse(transport_errc::unauthenticated, "authentication modes differ");
    if (h->to != owner().self_) {
      return refuse(transport_errc::peer_unreachable, fmt::format("HELLO is for node {}", h->to));
    }
    const auto& handshake = server_.emplace(owner().self_, peer_, h->nonce);
    wire::challenge c{.auth = auth(), .from = owner().self_, .nonce = handshake.nonce()};
    if (auth() == wire::auth_mode::hmac_sha256) c.proof = handshake.proof(owner().options_.secret);
    auto self = shared_from_this();
    send_handshake(wire::encode(c), [self] {
      self->read_handshake(
          [self](wire::frame_type t, std::span<const std::byte> b) { self->on_proof(t, b); });
    });
  }

  void on_proof(wire::frame_type type, std::span<const std::byte> body) {
    if (type == wire::frame_type::refuse) return on_refused(body);
    if (type != wire::frame_type::proof) return violation("expected PROOF");
    const auto p = wire::parse_proof(body);
    if (!p) return violation("malformed PROOF");
    if (auth() == wire::auth_mode::hmac_sha256 && !server_->holds(owner().options_.secret, *p))
      return refuse(transport_errc::unauthenticated,
                    "wrong proof: the peer does not hold the job secret");
    const auto links =
        std::count_if(owner().incoming_.begin(), owner().incoming_.end(),
                      [this](const auto& l) { return l->ready() && l->peer() == peer_; });
    if (static_cast<std::size_t>(links) >= owner().options_.max_links_per_node) {
      ++owner().stats_.connections_refused;
      refused_by_limit_ = true;
      return refuse(transport_errc::limit_exceeded,
                    fmt::format("node {} already has {} links (max_links_per_node)", peer_, links));
    }
    auto self = shared_from_this();
    send_handshake(wire::encode_accept(), [self] { self->became_ready(); });
  }

  void became_ready() {
    phase_ = phase::ready;
    error_code ignored;
    timer_.cancel(ignored);
    owner().on_link_ready(*this);
    read_next();
    flush();
  }

  // Established links.

  void read_next() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(head_), [self](const error_code& ec, std::size_t got) {
      if (self->closed()) return;
      if (ec)
        return self->drop(transport_errc::connection_lost,
                          (got > 0 ? mid_frame : "") + ec.message());
      self->on_head();
    });
  }

  void on_head() {
    const auto h = wire::parse_head(head_);
    if (!h) return violation("empty frame");
    const std::size_t body = h->length - 1;
    const auto type = static_cast<wire::frame_type>(h->type);
    if (!outgoing_ && type == wire::frame_type::control) {
      if (body == 0 || body > owner().options_.limits.max_frame_bytes) {
        return violation(fmt::format("control frame of {} bytes", body));
      }
      return read_body(body, [](link& l) { l.on_control(); });
    }
    if (!outgoing_ && type == wire::frame_type::write) {
      if (body != wire::write_header_bytes) return violation("WRITE header of the wrong size");
      return read_body(body, [](link& l) { l.on_write_header(); });
    }
    if (!outgoing_ && type == wire::frame_type::local_write) {
      if (!owner().copier_) {
        return violation(
            "LOCAL_WRITE, but this node does not run the same-host transport (cma): every node "
            "of a job must use the same transport");
      }
      if (body != wire::local_write_bytes) return violation("LOCAL_WRITE of the wrong size");
      return read_body(body, [](link& l) { l.on_local_write(); });
    }
    if (outgoing_ && type == wire::frame_type::write_ack) {
      if (body != wire::write_ack_bytes) return violation("WRITE_ACK of the wrong size");
      return read_body(body, [](link& l) { l.on_write_ack(); });
    }
    violation(fmt::format("unexpected frame type {} on an {} link", h->type,
                          outgoing_ ? "outgoing" : "incoming"));
  }

  void read_body(std::size_t n, void (*next)(link&)) {
    body_.resize(n);
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(body_), large_transfers{},
                     [self, next](const error_code& ec, std::size_t) {
                       if (self->closed()) return;
                       if (ec)
                         return self->drop(transport_errc::connection_lost,
                                           mid_frame + ec.message());
                       next(*self);
                     });
  }

  void on_control() {
    if (owner().events_.on_frame) owner().events_.on_frame(peer_, body_);
    if (!closed()) read_next();
  }

  void on_write_header() {
    const auto h = wire::parse_write(body_);
    if (!h) return violation("malformed WRITE");
    if (auto target = owner().regions_.begin_write(h->region, h->key, h->offset, h->length);
        !target) {
      return refuse_payload(*h, h->length, target.error());
    }
    payload_region_ = h->region;
    read_payload(*h, 0);
  }

  /// The payload read so far has ended: landed whole, refused, or cut short by the link's end.
  void end_payload() {
    if (payload_region_) owner().regions_.end_write(*payload_region_);
    payload_region_.reset();
  }

  /// Reads a write's payload straight into its region (no staging copy), a piece at a time, the
  /// key checked again before each: once the region's owner retired the key (`rekey_region`, a
  /// new epoch), the rest is refused, so that an older epoch's write still arriving stops landing.
  void read_payload(const wire::write_header& h, std::uint64_t landed) {
    if (landed == h.length) {
      end_payload();
      enqueue_ack(h.id, 0);
      const write_notice notice{
          .from = peer_, .region = h.region, .offset = h.offset, .length = h.length, .imm = h.imm};
      if (owner().events_.on_write) owner().events_.on_write(notice);
      if (!closed()) read_next();
      return;
    }
    const auto piece = std::min<std::uint64_t>(h.length - landed, payload_piece);
    auto target = owner().regions_.resolve(h.region, h.key, h.offset + landed, piece);
    if (!target) {
      end_payload();
      return refuse_payload(h, h.length - landed, target.error());
    }
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(target->data(), target->size()), large_transfers{},
                     [self, h, landed, piece](const error_code& ec, std::size_t) {
                       if (self->closed()) return;
                       if (ec) return self->drop(transport_errc::connection_lost, ec.message());
                       self->read_payload(h, landed + piece);
                     });
  }

  /// Drains the `left` payload bytes of a write the region check refused and acks it with why.
  void refuse_payload(const wire::write_header& h, std::uint64_t left, std::error_code why) {
    ++owner().stats_.writes_refused;
    log::warn("tcp {}: refused a write of {} bytes from node {}: {}", owner().self_, h.length,
              peer_, why.message());
    drain(left, [id = h.id, why](link& l) {
      l.enqueue_ack(id, static_cast<std::uint16_t>(why.value()));
      l.read_next();
    });
  }

  /// Same-host mode: checks the write like a WRITE, then has the copier pull its bytes out of the
  /// writer's memory while the link reads on; acks and reports the write once they landed.
  void on_local_write() {
    const auto h = wire::parse_local_write(body_);
    if (!h) return violation("malformed LOCAL_WRITE");
    const auto& w = h->write;
    auto target = owner().regions_.begin_write(w.region, w.key, w.offset, w.length);
    if (!target) {
      ++owner().stats_.writes_refused;
      log::warn("tcp {}: refused a write of {} bytes from node {}: {}", owner().self_, w.length,
                peer_, target.error().message());
      enqueue_ack(w.id, static_cast<std::uint16_t>(target.error().value()));
      return read_next();
    }
    if (h->host != owner().host_tag_) {
      owner().regions_.end_write(w.region);
      ++owner().stats_.copies_failed;
      log::warn(
          "tcp {}: refused a same-host write from node {}: it runs on another host, or in another "
          "pid or network namespace, where cma cannot reach; use tcp or fabric there",
          owner().self_, peer_);
      enqueue_ack(w.id, static_cast<std::uint16_t>(transport_errc::not_same_host));
      return read_next();
    }
    auto self = shared_from_this();
    // The copy ends in the region's table even when this link is gone by then.
    owner().copier_->async_copy(static_cast<pid_t>(h->pid), h->source, *target, w.region,
                                [self, h = *h, transport = owner().weak_from_this()](int error) {
                                  if (auto t = transport.lock())
                                    t->regions_.end_write(h.write.region);
                                  self->on_copied(h, error);
                                });
    if (++copies_ < owner().options_.max_copies_per_link) return read_next();
    reading_paused_ = true;  // on_copied reads on
  }

  void on_copied(const wire::local_write_header& h, int error) {
    if (closed()) return;  // the writer learns from the lost link
    --copies_;
    if (error) {
      ++owner().stats_.copies_failed;
      log::warn("tcp {}: same-host write of {} bytes from node {} failed: {}", owner().self_,
                h.write.length, peer_, copy_error_text(error, static_cast<pid_t>(h.pid)));
      enqueue_ack(h.write.id, static_cast<std::uint16_t>(copy_error_code(error).value()));
    } else {
      enqueue_ack(h.write.id, 0);
      const write_notice notice{.from = peer_,
                                .region = h.write.region,
                                .offset = h.write.offset,
                                .length = h.write.length,
                                .imm = h.write.imm};
      if (owner().events_.on_write) owner().events_.on_write(notice);
    }
    if (reading_paused_ && !closed()) {
      reading_paused_ = false;
      read_next();
    }
  }

  /// Reads and discards `left` payload bytes of a refused write, a small buffer at a time.
  void drain(std::uint64_t left, std::function<void(link&)> then) {
    if (left == 0) return then(*this);
    scratch_.resize(64 * 1024);
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, scratch_.size()));
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(scratch_.data(), n),
                     [self, left, n, then](const error_code& ec, std::size_t) {
                       if (self->closed()) return;
                       if (ec) return self->drop(transport_errc::connection_lost, ec.message());
                       self->drain(left - n, then);
                     });
  }

  void enqueue_ack(std::uint64_t id, std::uint16_t status) {
    out_item item;
    item.head = wire::encode(wire::write_ack{.id = id, .status = status});
    queue_.push_back(std::move(item));
    flush();
  }

  void on_write_ack() {
    const auto a = wire::parse_write_ack(body_);
    if (!a) return violation("malformed WRITE_ACK");
    auto it = pending_writes_.find(a->id);
    if (it == pending_writes_.end())
      return violation(fmt::format("WRITE_ACK for unknown write {}", a->id));
    auto done = std::move(it->second);
    pending_writes_.erase(it);
    std::error_code why;
    if (a->status != 0) why = refusal_error(a->status);
    done(why);
    if (!closed()) read_next();
  }

  /// Writes queued frames, several per system call, payloads straight from the caller's memory.
  void flush() {
    if (writing_ || !ready() || queue_.empty()) return;
    writing_ = true;
    while (!queue_.empty() && inflight_.size() < 16) {
      inflight_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(inflight_.size() * 2);
    for (const auto& item : inflight_) {
      buffers.emplace_back(item.head.data(), item.head.size());
      if (!item.body.empty()) buffers.emplace_back(item.body.data(), item.body.size());
    }
    auto self = shared_from_this();
    asio::async_write(socket_, buffers, large_transfers{},
                      [self](const error_code& ec, std::size_t) {
                        if (self->closed()) return;
                        if (ec) return self->drop(transport_errc::connection_lost, ec.message());
                        auto done = std::move(self->inflight_);
                        self->inflight_.clear();
                        self->writing_ = false;
                        self->flush();
                        for (auto& item : done) {
                          if (item.sent) item.sent({});
                        }
                      });
  }

  friend class tcp_transport;

  tcp_transport* owner_;  ///< null once closed
  asio::io_context& io_;
  bool outgoing_;
  ip::tcp::socket socket_;
  asio::steady_timer timer_;
  std::unique_ptr<ip::tcp::resolver> resolver_;
  node_id peer_;
  phase phase_ = phase::connecting;
  bool refused_by_limit_ = false;
  std::uint64_t incoming_id_ = 0;
  bool spoke_ = false;
  std::string remote_;
  ip::address remote_ip_;
  std::string detail_;
  std::optional<client_handshake> client_;  ///< on links we open
  std::optional<server_handshake> server_;  ///< on links we accept
  std::array<std::byte, wire::head_bytes> head_{};
  std::vector<std::byte> body_;
  std::vector<std::byte> scratch_;
  std::deque<out_item> queue_;
  std::vector<out_item> inflight_;
  bool writing_ = false;
  std::map<std::uint64_t, completion> pending_writes_;
  std::size_t copies_ = 0;  ///< same-host copies running for this incoming link
  /// The region of the WRITE whose payload this link is reading, under way in its table.
  std::optional<std::uint64_t> payload_region_;
  bool reading_paused_ = false;  ///< at `max_copies_per_link`: the next read waits for a copy
};

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
