// A tcp link's handshake (docs/wire-format.md): the client's side (HELLO, PROOF) and the
// server's (CHALLENGE, ACCEPT), either ending in REFUSE.
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "transport/tcp/tcp_link.hpp"

namespace ferry {
namespace {

namespace ip = asio::ip;
namespace wire = tcp_link;
using boost::system::error_code;

}  // namespace

void tcp_transport::link::refuse(transport_errc reason, std::string detail) {
  auto self = shared_from_this();
  send_handshake(wire::encode_refuse(static_cast<std::uint16_t>(reason)),
                 [self, reason, detail] { self->drop(reason, detail); });
}

void tcp_transport::link::send_handshake(std::vector<std::byte> bytes, std::function<void()> then) {
  auto buffer = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(*buffer),
                    [self, buffer, then](const error_code& ec, std::size_t) {
                      if (self->closed()) return;
                      if (ec) return self->drop(transport_errc::connection_lost, ec.message());
                      then();
                    });
}

void tcp_transport::link::read_handshake(frame_handler next) {
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

void tcp_transport::link::connected() {
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
  send_handshake(wire::encode(wire::hello{auth(), owner().self_, peer_, client_->nonce()}), [self] {
    self->read_handshake([self](wire::frame_type type, std::span<const std::byte> body) {
      self->on_challenge(type, body);
    });
  });
}

void tcp_transport::link::on_challenge(wire::frame_type type, std::span<const std::byte> body) {
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

void tcp_transport::link::on_accept(wire::frame_type type, std::span<const std::byte> body) {
  if (type == wire::frame_type::refuse) return on_refused(body);
  if (type != wire::frame_type::accept || !body.empty()) return violation("expected ACCEPT");
  became_ready();
}

void tcp_transport::link::on_refused(std::span<const std::byte> body) {
  const auto reason = wire::parse_refuse(body);
  if (!reason) return violation("malformed REFUSE");
  drop(refusal_error(*reason), "refused by the peer");
}

void tcp_transport::link::on_hello(wire::frame_type type, std::span<const std::byte> body) {
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

void tcp_transport::link::on_proof(wire::frame_type type, std::span<const std::byte> body) {
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

void tcp_transport::link::became_ready() {
  phase_ = phase::ready;
  error_code ignored;
  timer_.cancel(ignored);
  owner().on_link_ready(*this);
  read_next();
  flush();
}

}  // namespace ferry
