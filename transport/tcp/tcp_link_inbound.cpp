// What an established tcp link reads: control frames, writes and their payloads (into the
// region, or copied out of the writer's memory in same-host mode), and acks of our writes.
#include <boost/asio/read.hpp>

#include "runtime/log.hpp"
#include "transport/tcp/tcp_link.hpp"

namespace ferry {
namespace {

namespace ip = asio::ip;
namespace wire = tcp_link;
using boost::system::error_code;

/// A write's payload is read into its region by pieces of this size, its key checked before each.
constexpr std::uint64_t payload_piece = std::uint64_t{4} << 20;

}  // namespace

void tcp_transport::link::read_next() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(head_), [self](const error_code& ec, std::size_t got) {
    if (self->closed()) return;
    if (ec)
      return self->drop(transport_errc::connection_lost,
                        std::string(got > 0 ? mid_frame : "") + ec.message());
    self->on_head();
  });
}

void tcp_transport::link::on_head() {
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

void tcp_transport::link::read_body(std::size_t n, void (*next)(link&)) {
  body_.resize(n);
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(body_), large_transfers{},
                   [self, next](const error_code& ec, std::size_t) {
                     if (self->closed()) return;
                     if (ec)
                       return self->drop(transport_errc::connection_lost,
                                         std::string(mid_frame) + ec.message());
                     next(*self);
                   });
}

void tcp_transport::link::on_control() {
  if (owner().events_.on_frame) owner().events_.on_frame(peer_, body_);
  if (!closed()) read_next();
}

void tcp_transport::link::on_write_header() {
  const auto h = wire::parse_write(body_);
  if (!h) return violation("malformed WRITE");
  if (auto target = owner().regions_.begin_write(h->region, h->key, h->offset, h->length);
      !target) {
    return refuse_payload(*h, h->length, target.error());
  }
  payload_region_ = h->region;
  read_payload(*h, 0);
}

void tcp_transport::link::end_payload() {
  if (payload_region_) owner().regions_.end_write(*payload_region_);
  payload_region_.reset();
}

void tcp_transport::link::read_payload(const wire::write_header& h, std::uint64_t landed) {
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

void tcp_transport::link::refuse_payload(const wire::write_header& h, std::uint64_t left,
                                         std::error_code why) {
  ++owner().stats_.writes_refused;
  log::warn("tcp {}: refused a write of {} bytes from node {}: {}", owner().self_, h.length, peer_,
            why.message());
  drain(left, [id = h.id, why](link& l) {
    l.enqueue_ack(id, static_cast<std::uint16_t>(why.value()));
    l.read_next();
  });
}

void tcp_transport::link::on_local_write() {
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

void tcp_transport::link::on_copied(const wire::local_write_header& h, int error) {
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

void tcp_transport::link::drain(std::uint64_t left, std::function<void(link&)> then) {
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

void tcp_transport::link::on_write_ack() {
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

}  // namespace ferry
