#include "transport/peer_watch.hpp"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>

#include "runtime/log.hpp"

namespace ferry {
namespace {

namespace ip = asio::ip;
using boost::system::error_code;

constexpr std::array<std::byte, 4> magic{std::byte{'F'}, std::byte{'R'}, std::byte{'Y'},
                                         std::byte{'W'}};
/// magic, be32 greeter, be32 greeted, the greeter's nonce, its proof.
constexpr std::size_t greeting_bytes = 4 + 4 + 4 + 32 + 32;
using greeting = std::array<std::byte, greeting_bytes>;
constexpr auto greeting_deadline = std::chrono::seconds(1);
/// The one byte a listener ever sends: the greeting did not prove the secret.
constexpr std::byte refused{0x52};
/// Connections held per greeter id: its own, and a re-greeting whose earlier end is not yet read.
constexpr std::size_t max_held_per_peer = 4;
/// Accepted connections not yet greeted; more are closed at once.
constexpr std::size_t max_greeting = 64;

void put_be32(std::byte* at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}
std::uint32_t get_be32(const std::byte* at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<std::uint32_t>(at[i]);
  return v;
}

greeting make_greeting(std::span<const std::byte> secret, node_id from, node_id to) {
  greeting g{};
  std::memcpy(g.data(), magic.data(), magic.size());
  put_be32(g.data() + 4, from);
  put_be32(g.data() + 8, to);
  const auto nonce = make_link_nonce();
  std::memcpy(g.data() + 12, nonce.data(), nonce.size());
  const auto proof = make_link_proof(secret, link_role::watch, nonce, link_nonce{}, from, to);
  std::memcpy(g.data() + 44, proof.data(), proof.size());
  return g;
}

/// The greeter's id, when `g` greets `self` and proves the secret.
std::optional<node_id> greeter(const greeting& g, std::span<const std::byte> secret, node_id self) {
  if (std::memcmp(g.data(), magic.data(), magic.size()) != 0 || get_be32(g.data() + 8) != self)
    return std::nullopt;
  const node_id from = get_be32(g.data() + 4);
  link_nonce nonce;
  link_proof proof;
  std::memcpy(nonce.data(), g.data() + 12, nonce.size());
  std::memcpy(proof.data(), g.data() + 44, proof.size());
  if (!same_proof(proof,
                  make_link_proof(secret, link_role::watch, nonce, link_nonce{}, from, self)))
    return std::nullopt;
  return from;
}

}  // namespace

struct peer_watch::watched {
  explicit watched(asio::io_context& io) : socket(io) {}
  ip::tcp::socket socket;
  greeting hello{};
  std::array<std::byte, 64> sink{};  ///< the peer sends nothing; whatever comes is dropped
};

struct peer_watch::held {
  explicit held(asio::io_context& io) : socket(io), deadline(io) {}
  ip::tcp::socket socket;
  asio::steady_timer deadline;
  greeting hello{};
  std::array<std::byte, 64> sink{};
};

std::shared_ptr<peer_watch> peer_watch::make(asio::io_context& io, node_id self, job_secret secret,
                                             std::function<void(node_id)> on_gone) {
  return std::make_shared<peer_watch>(io, self, std::move(secret), std::move(on_gone));
}

peer_watch::peer_watch(asio::io_context& io, node_id self, job_secret secret,
                       std::function<void(node_id)> on_gone)
    : io_(io),
      self_(self),
      secret_(std::move(secret)),
      on_gone_(std::move(on_gone)),
      acceptor_(io) {}

std::error_code peer_watch::listen(const std::string& host) {
  error_code ec;
  const auto address = ip::make_address(host, ec);
  if (ec) return ec;
  const ip::tcp::endpoint at(address, 0);
  if (acceptor_.open(at.protocol(), ec); ec) return ec;
  if (acceptor_.bind(at, ec); ec) return ec;
  if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec) return ec;
  accept();
  return {};
}

std::string peer_watch::address() const {
  error_code ec;
  const auto at = acceptor_.local_endpoint(ec);
  if (ec) return {};
  const auto host = at.address().to_string();
  return (at.address().is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(at.port());
}

void peer_watch::watch(node_id peer, std::string_view address) {
  if (closed_) return;
  const auto colon = address.rfind(':');
  std::uint16_t port = 0;
  error_code ec;
  auto host = std::string(address.substr(0, colon == std::string_view::npos ? 0 : colon));
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const auto ip_address = ip::make_address(host, ec);
  const auto* end = address.data() + address.size();
  if (colon == std::string_view::npos || ec ||
      std::from_chars(address.data() + colon + 1, end, port).ptr != end) {
    log::warn("node {}: cannot watch node {} at '{}': not host:port", self_, peer, address);
    return;
  }
  auto w = std::make_shared<watched>(io_);
  if (auto old = std::exchange(watched_[peer], w))
    old->socket.close(ec);  // its end is no longer news
  w->hello = make_greeting(secret_, self_, peer);
  w->socket.async_connect({ip_address, port},
                          [self = shared_from_this(), peer, w](const error_code& connected) {
                            if (self->closed_ || !self->watching(peer, w)) return;
                            // Refused: nothing listens there, the process is gone. Anything else
                            // (the network) the heartbeat's timeout settles.
                            if (connected == asio::error::connection_refused)
                              return self->gone(peer, w);
                            if (connected) return;
                            asio::async_write(w->socket, asio::buffer(w->hello),
                                              [self, peer, w](const error_code& sent, std::size_t) {
                                                if (!sent) self->watch_until_end(peer, w);
                                              });
                          });
}

void peer_watch::watch_until_end(node_id peer, const std::shared_ptr<watched>& w) {
  w->socket.async_read_some(asio::buffer(w->sink), [self = shared_from_this(), peer, w](
                                                       const error_code& ec, std::size_t n) {
    if (self->closed_ || !self->watching(peer, w)) return;
    if (ec) return self->gone(peer, w);
    if (n > 0 && w->sink[0] == refused) {
      // Not a death: the peer holds another secret (or id), and its link says so by itself.
      log::warn("node {}: node {} refused this node's watch greeting (another job secret?)",
                self->self_, peer);
      return self->forget(peer);
    }
    self->watch_until_end(peer, w);
  });
}

bool peer_watch::watching(node_id peer, const std::shared_ptr<watched>& w) const {
  const auto it = watched_.find(peer);
  return it != watched_.end() && it->second == w;
}

void peer_watch::gone(node_id peer, const std::shared_ptr<watched>& w) {
  error_code ec;
  w->socket.close(ec);
  watched_.erase(peer);
  on_gone_(peer);
}

void peer_watch::forget(node_id peer) {
  auto it = watched_.find(peer);
  if (it == watched_.end()) return;
  error_code ec;
  it->second->socket.close(ec);
  watched_.erase(it);
}

void peer_watch::accept() {
  auto h = std::make_shared<held>(io_);
  acceptor_.async_accept(h->socket, [self = shared_from_this(), h](const error_code& ec) {
    if (self->closed_ || ec == asio::error::operation_aborted) return;
    if (!ec && self->greeting_ < max_greeting) {
      ++self->greeting_;
      h->deadline.expires_after(greeting_deadline);
      h->deadline.async_wait([h](const error_code& timer) {
        error_code ignored;
        if (!timer) h->socket.close(ignored);
      });
      asio::async_read(h->socket, asio::buffer(h->hello),
                       [self, h](const error_code& read, std::size_t) {
                         h->deadline.cancel();
                         --self->greeting_;
                         if (self->closed_) return;
                         if (!read) return self->greeted(h);
                         error_code ignored;
                         h->socket.close(ignored);
                       });
    }
    self->accept();
  });
}

void peer_watch::greeted(const std::shared_ptr<held>& h) {
  // A greeting that fails, or one more of an id that holds its share already (a replay, since a
  // live greeter's own earlier connection is closed before it greets again), is refused: told,
  // so that the greeter does not take the close for this node's death. Closing an earlier one
  // instead would let a replayed greeting make a live peer see this node die.
  const auto from = greeter(h->hello, secret_, self_);
  if (!from || held_.count(*from) >= max_held_per_peer) {
    asio::async_write(h->socket, asio::buffer(&refused, 1), [h](const error_code&, std::size_t) {
      error_code ignored;
      h->socket.close(ignored);
    });
    return;
  }
  held_.emplace(*from, h);
  hold(*from, h);
}

void peer_watch::hold(node_id from, const std::shared_ptr<held>& h) {
  h->socket.async_read_some(asio::buffer(h->sink), [self = shared_from_this(), from, h](
                                                       const error_code& ec, std::size_t) {
    if (self->closed_) return;
    if (!ec) return self->hold(from, h);
    error_code ignored;
    h->socket.close(ignored);
    const auto [first, last] = self->held_.equal_range(from);
    for (auto it = first; it != last; ++it) {
      if (it->second == h) {
        self->held_.erase(it);
        break;
      }
    }
  });
}

void peer_watch::close() {
  if (closed_) return;
  closed_ = true;
  error_code ec;
  acceptor_.close(ec);
  for (auto& [peer, w] : watched_) w->socket.close(ec);
  for (auto& [peer, h] : held_) h->socket.close(ec);
  watched_.clear();
  held_.clear();
}

}  // namespace ferry
