// A tcp link's life: connecting or accepted, its queue of frames and writes going out, and its end.
#include "transport/tcp/tcp_link.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/write.hpp>

namespace ferry {
namespace {

namespace ip = asio::ip;
namespace wire = tcp_link;
using boost::system::error_code;

}  // namespace

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

void refuse_now(ip::tcp::socket& socket, transport_errc reason) {
  const auto bytes = wire::encode_refuse(static_cast<std::uint16_t>(reason));
  error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
  socket.shutdown(ip::tcp::socket::shutdown_send, ignored);
}

bool tcp_transport::link::spoke() const {
  error_code ec;
  return spoke_ || socket_.available(ec) > 0;
}

void tcp_transport::link::start_client(const std::string& host, std::uint16_t port) {
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
        asio::async_connect(
            self->socket_, results,
            [on_connected](const error_code& cec, const ip::tcp::endpoint&) { on_connected(cec); });
      });
}

void tcp_transport::link::start_server(const ip::tcp::endpoint& remote, std::uint64_t incoming_id) {
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

void tcp_transport::link::enqueue_control(frame f, completion sent) {
  out_item item;
  const auto head = wire::make_head(wire::frame_type::control, f.size() - frame_prefix_bytes);
  item.head.assign(head.begin(), head.end());
  item.keep = std::move(f);
  item.body = std::span<const std::byte>(item.keep).subspan(frame_prefix_bytes);
  item.sent = std::move(sent);
  queue_.push_back(std::move(item));
  flush();
}

void tcp_transport::link::enqueue_write(const wire::write_header& h,
                                        std::span<const std::byte> payload, completion done) {
  pending_writes_.emplace(h.id, std::move(done));
  out_item item;
  item.head = wire::encode(h);
  item.body = payload;
  queue_.push_back(std::move(item));
  flush();
}

void tcp_transport::link::enqueue_local_write(const wire::local_write_header& h, completion done) {
  pending_writes_.emplace(h.write.id, std::move(done));
  out_item item;
  item.head = wire::encode(h);
  queue_.push_back(std::move(item));
  flush();
}

void tcp_transport::link::enqueue_ack(std::uint64_t id, std::uint16_t status) {
  out_item item;
  item.head = wire::encode(wire::write_ack{.id = id, .status = status});
  queue_.push_back(std::move(item));
  flush();
}

void tcp_transport::link::flush() {
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
  asio::async_write(socket_, buffers, large_transfers{}, [self](const error_code& ec, std::size_t) {
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

void tcp_transport::link::evict(std::string detail) {
  if (closed()) return;
  refused_by_limit_ = true;
  refuse_now(socket_, transport_errc::limit_exceeded);
  drop(transport_errc::limit_exceeded, detail);
}

void tcp_transport::link::shut(std::error_code why) {
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

void tcp_transport::link::arm_timer() {
  timer_.expires_after(owner().options_.handshake_timeout);
  auto self = shared_from_this();
  timer_.async_wait([self](const error_code& ec) {
    if (ec || self->closed() || self->ready()) return;
    self->drop(errc::timed_out, "handshake did not finish in time");
  });
}

void tcp_transport::link::drop(std::error_code why, std::string_view detail) {
  if (closed()) return;
  detail_ = detail;
  owner().on_link_lost(shared_from_this(), why);
}

void tcp_transport::link::violation(std::string_view what) {
  drop(transport_errc::protocol_violation, what);
}

}  // namespace ferry
