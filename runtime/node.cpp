#include "runtime/node.hpp"

#include <numeric>

#include "runtime/actor.hpp"
#include "runtime/log.hpp"

namespace ferry {

std::uint64_t node_stats::rejected_total() const {
  return std::accumulate(rejected.begin(), rejected.end(), 0ull);
}

node::node(environment& env, node_id id, std::shared_ptr<ferry::transport> transport,
           const message_registry& registry, codec_limits limits)
    : env_(env), id_(id), transport_(std::move(transport)), registry_(registry), limits_(limits) {}

node::~node() {
  close();
}

std::error_code node::start() {
  hands_over_ = transport_->hands_over_messages();
  return transport_->start(transport_events{
      .on_frame = [this](node_id from,
                         std::span<const std::byte> payload) { receive(from, payload); },
      .on_message = [this](node_id from, decoded_message m) { receive(from, std::move(m)); },
      .on_write =
          [this](const write_notice& n) {
            ++stats_.writes_in;
            stats_.bytes_in += n.length;
            if (auto it = write_handlers_.find(imm_tag(n.imm)); it != write_handlers_.end())
              it->second(n);
          },
      .on_peer_lost =
          [this](node_id peer, std::error_code why) {
            if (departures_expected_) {
              log::debug("node {}: peer {} went: {}", id_, peer, why.message());
            } else {
              log::warn("node {}: lost peer {}: {}", id_, peer, why.message());
            }
            if (peer_lost_) peer_lost_(peer, why);
            for (const auto& [token, watcher] : std::map(peer_watchers_)) watcher(peer, why);
          },
  });
}

std::uint64_t node::watch_peers(std::function<void(node_id, std::error_code)> watcher) {
  peer_watchers_.emplace(next_watcher_, std::move(watcher));
  return next_watcher_++;
}

void node::close() {
  for (auto& [id, a] : actors_) a->stop();
  transport_->close();
}

void node::attach(actor& a) {
  actors_[a.self().actor] = &a;
}
void node::detach(actor& a) {
  actors_.erase(a.self().actor);
}

void node::route(address to, frame f, std::function<void(std::error_code)> sent) {
  if (to.node != id_) {
    auto failed = [this, to](std::error_code ec) {
      if (ec) log::debug("node {}: send to {}.{} failed: {}", id_, to.node, to.actor, ec.message());
    };
    if (!sent)
      return transport_->async_send(to.node, std::move(f), failed);  // small: no allocation
    transport_->async_send(to.node, std::move(f),
                           [failed, sent = std::move(sent)](std::error_code ec) {
                             failed(ec);
                             sent(ec);
                           });
    return;
  }
  // Local delivery goes through the same strict decoder, on a later turn of the loop.
  loop().post([this, f = std::move(f), sent = std::move(sent)] {
    receive(id_, std::span(f).subspan(frame_prefix_bytes));
    if (sent) sent({});
  });
}

void node::route(address to, handed_message m, std::function<void(std::error_code)> sent) {
  if (to.node != id_) return transport_->async_hand_over(to.node, std::move(m), std::move(sent));
  loop().post([this, m = std::move(m.message), sent = std::move(sent)]() mutable {
    receive(id_, std::move(m));
    if (sent) sent({});
  });
}

void node::on_write(std::uint8_t tag, std::function<void(const write_notice&)> handler) {
  write_handlers_[tag] = std::move(handler);
}

void node::forget_writes(std::uint8_t tag) {
  write_handlers_.erase(tag);
}

void node::receive(node_id from, std::span<const std::byte> payload) {
  ++stats_.frames_in;
  auto m = decode_payload(payload, registry_, limits_);
  if (!m) return reject(from, m.error());
  accept(from, std::move(*m));
}

void node::receive(node_id from, decoded_message m) {
  ++stats_.frames_in;
  if (!registry_.find(m.head.kind)) return reject(from, errc::unknown_kind);
  accept(from, std::move(m));
}

void node::accept(node_id from, decoded_message m) {
  if (m.head.from.node != from) return reject(from, errc::forged_sender);
  if (m.head.to.node != id_) return reject(from, errc::unknown_peer);
  auto it = actors_.find(m.head.to.actor);
  if (it == actors_.end()) return reject(from, errc::unknown_actor);
  ++stats_.delivered;
  it->second->enqueue(std::move(m));
}

void node::reject(node_id from, std::error_code why) {
  const auto index = why.category() == runtime_category() ? why.value() : 0;
  ++stats_.rejected[static_cast<std::size_t>(index) < stats_.rejected.size() ? index : 0];
  log::warn("node {}: rejected a frame from node {}: {}", id_, from, why.message());
}

}  // namespace ferry
