#include "transport/fabric/peer_traffic.hpp"

namespace ferry::fabric_link {

void peer_traffic::accepted(node_id peer, time_point now) {
  ++in_flight_;
  auto& p = peers_[peer];
  ++p.in_flight;
  p.last_progress = now;
}

void peer_traffic::completed(node_id peer, bool abandoned, time_point now) {
  --in_flight_;
  if (abandoned) {
    --abandoned_in_flight_;
    return;
  }
  auto& p = peers_[peer];
  --p.in_flight;
  p.last_progress = now;
}

void peer_traffic::wait(node_id peer, waiting_op op, time_point now) {
  ++waiting_;
  auto& p = peers_[peer];
  if (p.idle()) p.last_progress = now;
  p.waiting.push_back(op);
}

bool peer_traffic::must_wait(node_id peer) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && (!it->second.waiting.empty() || it->second.order_holders > 0);
}

void peer_traffic::forget(node_id peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  waiting_ -= it->second.waiting.size();
  abandoned_in_flight_ += it->second.in_flight;
  peers_.erase(it);
}

std::vector<peer_traffic::stalled_peer> peer_traffic::stalled(time_point now,
                                                              std::chrono::milliseconds timeout) {
  std::vector<stalled_peer> out;
  if (now < next_check_) return out;
  next_check_ = now + check_period;
  for (const auto& [peer, p] : peers_)
    if (!p.idle() && now - p.last_progress > timeout)
      out.push_back({.peer = peer, .waiting = p.waiting.size(), .in_flight = p.in_flight});
  return out;
}

void peer_traffic::clear() {
  peers_.clear();
  waiting_ = 0;
}

}  // namespace ferry::fabric_link
