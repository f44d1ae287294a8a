#include "transport/inproc/inproc_transport.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/log.hpp"

namespace ferry {

std::shared_ptr<inproc_transport> inproc_network::find(node_id id) const {
  std::lock_guard lock(mutex_);
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : it->second.lock();
}

void inproc_network::attach(node_id id, std::weak_ptr<inproc_transport> t) {
  std::lock_guard lock(mutex_);
  nodes_[id] = std::move(t);
  ++changes_;
}

void inproc_network::sever(node_id id, bool announced) {
  auto dead = find(id);
  if (dead) dead->close();
  if (!announced) return;
  std::vector<std::shared_ptr<inproc_transport>> others;
  {
    std::lock_guard lock(mutex_);
    std::vector<node_id> ids;  // told in the order of their ids, so that a run replays alike
    for (const auto& [n, weak] : nodes_) ids.push_back(n);
    std::sort(ids.begin(), ids.end());
    for (const auto n : ids) {
      if (auto t = nodes_.at(n).lock()) others.push_back(std::move(t));
    }
  }
  for (auto& t : others) t->loop_.post([t, id] { t->peer_died(id); });
}

void inproc_network::cut(node_id id) {
  std::lock_guard lock(mutex_);
  cut_.insert(id);
  ++changes_;
}

inproc_network::reach_result inproc_network::reach(node_id from, node_id to) const {
  std::lock_guard lock(mutex_);
  auto it = nodes_.find(to);
  if (it == nodes_.end()) return {};
  return {.peer = it->second.lock(),
          .cut = !cut_.empty() && (cut_.contains(from) || cut_.contains(to)),
          .as_of = changes_.load()};
}

void inproc_network::hold(node_id from, node_id to, std::function<void(inproc_transport&)> arrive) {
  std::lock_guard lock(mutex_);
  held_.push_back({from, to, std::move(arrive)});
}

void inproc_network::closed(node_id by, node_id peer) {
  std::lock_guard lock(mutex_);
  if (cut_.contains(by) || cut_.contains(peer)) broken_.insert(std::minmax(by, peer));
}

void inproc_network::mend(node_id id) {
  std::vector<held> arriving;
  std::vector<std::pair<node_id, node_id>> broken;
  {
    std::lock_guard lock(mutex_);
    cut_.erase(id);
    ++changes_;
    auto still_cut = [&](node_id a, node_id b) { return cut_.contains(a) || cut_.contains(b); };
    std::erase_if(held_, [&](held& h) {
      if (still_cut(h.from, h.to)) return false;
      if (!broken_.contains(std::minmax(h.from, h.to))) arriving.push_back(std::move(h));
      return true;
    });
    std::erase_if(broken_, [&](const auto& link) {
      if (still_cut(link.first, link.second)) return false;
      broken.push_back(link);
      return true;
    });
  }
  for (auto& h : arriving) {
    if (auto to = find(h.to); to && find(h.from))
      to->loop_.post([to, arrive = std::move(h.arrive)] { arrive(*to); });
  }
  for (auto [a, b] : broken) {
    if (auto t = find(a)) t->loop_.post([t, b] { t->peer_died(b); });
    if (auto t = find(b)) t->loop_.post([t, a] { t->peer_died(a); });
  }
}

void inproc_network::detach(node_id id) {
  std::lock_guard lock(mutex_);
  nodes_.erase(id);
  ++changes_;
}

std::shared_ptr<inproc_transport> inproc_transport::make(environment& env, inproc_network& network,
                                                         node_id self) {
  return std::make_shared<inproc_transport>(made_by_make{}, env, network, self);
}

inproc_transport::inproc_transport(made_by_make, environment& env, inproc_network& network,
                                   node_id self)
    : loop_(env.loop()),
      cpu_(env.cpu()),
      network_(network),
      self_(self),
      virtual_time_(env.is_virtual()),
      regions_(self) {}

inproc_transport::~inproc_transport() {
  close();
}

std::string inproc_transport::local_address() const {
  return std::to_string(self_);
}

std::error_code inproc_transport::start(transport_events events) {
  events_ = std::move(events);
  open_ = true;
  network_.attach(self_, weak_from_this());
  return {};
}

void inproc_transport::close() {
  if (!open_) return;
  open_ = false;
  network_.detach(self_);
}

std::error_code inproc_transport::add_peer(node_id peer, std::string_view) {
  peers_.insert(peer);
  return {};
}

void inproc_transport::remove_peer(node_id peer) {
  peers_.erase(peer);
  network_.closed(self_, peer);
}

void inproc_transport::peer_died(node_id peer) {
  if (!open_ || peers_.erase(peer) == 0 || !events_.on_peer_lost) return;
  events_.on_peer_lost(peer, make_error_code(std::errc::connection_reset));
}

void inproc_transport::lost_on_the_way(node_id peer) {
  // A peer reached before and gone now died: a sender learns so even when nobody announced it.
  if (!open_) return;
  const auto at = std::ranges::lower_bound(reached_, peer);
  if (at == reached_.end() || *at != peer) return;
  links_.erase(links_.begin() + (at - reached_.begin()));
  reached_.erase(at);
  loop_.post([self = shared_from_this(), peer] { self->peer_died(peer); });
}

inproc_network::reach_result inproc_transport::reach(node_id to) {
  if (!open_) return {};
  const auto at = std::ranges::lower_bound(reached_, to);
  const auto i = at - reached_.begin();
  const bool known = at != reached_.end() && *at == to;
  if (known && links_[i].as_of == network_.changes_.load()) {
    if (auto peer = links_[i].peer.lock())
      return {.peer = std::move(peer), .cut = links_[i].cut, .as_of = links_[i].as_of};
  }
  auto found = network_.reach(self_, to);
  if (!found.peer) return found;
  link now{.peer = found.peer, .cut = found.cut, .as_of = found.as_of};
  if (known) {
    links_[i] = std::move(now);
  } else {
    reached_.insert(at, to);
    links_.insert(links_.begin() + i, std::move(now));
  }
  return found;
}

void inproc_transport::async_send(node_id to, frame f, completion done) {
  const auto bytes = f.size();
  send(to, {.f = std::move(f), .bytes = bytes}, std::move(done));
}

void inproc_transport::async_hand_over(node_id to, handed_message m, completion done) {
  send(to, {.m = std::move(m.message), .bytes = m.frame_bytes}, std::move(done));
}

void inproc_transport::send(node_id to, parcel p, completion done) {
  // Frames wait only behind a modelled one still crossing (`outbox_` keeps no empty queue): with
  // none waiting anywhere, this one needs no lookup.
  if (outbox_.empty() && !modelled(p)) return hand_over(to, std::move(p), std::move(done));
  auto& queue = outbox_[to];
  queue.emplace_back(std::move(p), std::move(done));
  if (queue.size() == 1) send_queued(to);
}

void inproc_transport::hand_over(node_id to, parcel p, completion done) {
  auto [peer, cut, _] = reach(to);
  if (!peer) {
    if (done) {
      loop_.post([done = std::move(done)] { done(transport_errc::peer_unreachable); });
    } else {
      log::debug("inproc {}: a message to node {} found no one", self_, to);
    }
    lost_on_the_way(to);
    return;
  }
  if (cut) {
    network_.hold(self_, to,
                  [from = self_, p = std::move(p)](inproc_transport& at) { at.deliver(from, p); });
  } else {
    auto& loop = peer->loop_;
    loop.post([peer = std::move(peer), from = self_, p = std::move(p)] { peer->deliver(from, p); });
  }
  if (done) loop_.post([done = std::move(done)] { done({}); });
}

void inproc_transport::send_queued(node_id to) {
  auto it = outbox_.find(to);
  if (it == outbox_.end()) return;
  auto& queue = it->second;
  while (!queue.empty()) {
    if (modelled(queue.front().first) && open_ && network_.find(to)) {
      network_.model_frame(self_, to, queue.front().first.bytes, [self = weak_from_this(), to] {
        if (auto t = self.lock()) t->landed(to);
      });
      return;
    }
    auto [p, done] = std::move(queue.front());
    queue.pop_front();
    hand_over(to, std::move(p), std::move(done));
  }
  outbox_.erase(it);
}

void inproc_network::model_frame(node_id from, node_id to, std::uint64_t bytes,
                                 std::function<void()> landed) {
  std::function<void()> start;
  {
    std::lock_guard lock(mutex_);
    auto& waiting = frames_to_[to];
    waiting.push_back([this, from, to, bytes, landed = std::move(landed)] {
      model_(from, to, bytes, nullptr, nullptr, [this, to, landed] {
        landed();
        start_next_frame(to);
      });
    });
    if (waiting.size() == 1) start = waiting.front();
  }
  if (start) start();
}

void inproc_network::start_next_frame(node_id to) {
  std::function<void()> next;
  {
    std::lock_guard lock(mutex_);
    auto& waiting = frames_to_[to];
    waiting.pop_front();
    if (waiting.empty()) return;
    next = waiting.front();
  }
  next();
}

void inproc_transport::landed(node_id to) {
  auto it = outbox_.find(to);
  if (it == outbox_.end() || it->second.empty()) return;
  auto [p, done] = std::move(it->second.front());
  it->second.pop_front();
  hand_over(to, std::move(p), std::move(done));
  send_queued(to);
}

void inproc_transport::deliver(node_id from, const parcel& p) {
  if (!open_) return;
  if (p.m.body) {
    if (events_.on_message) events_.on_message(from, p.m);
    return;
  }
  if (!events_.on_frame || p.f.size() < frame_prefix_bytes) return;
  events_.on_frame(from, std::span(p.f).subspan(frame_prefix_bytes));
}

result<region_desc> inproc_transport::register_region(std::span<std::byte> memory) {
  return regions_.add(memory);
}
bool inproc_transport::reaches_device_memory() const {
  return virtual_time_ && network_.device_memory_;
}
result<region_desc> inproc_transport::register_device_region(std::span<std::byte> memory,
                                                             int device, std::string& why) {
  if (reaches_device_memory()) return regions_.add(memory);
  return transport::register_device_region(memory, device, why);
}
void inproc_transport::deregister_region(std::uint64_t region_id) {
  regions_.remove(region_id);
}
// A write held up by a cut is checked again when it arrives (`async_write`): the new key keeps it
// out.
result<region_desc> inproc_transport::rekey_region(std::uint64_t region_id) {
  return regions_.rekey(region_id);
}
bool inproc_transport::when_writes_end(std::uint64_t region_id, std::function<void()> done) {
  // Its last write may end on a sender's loop (another thread, in a process of several loops).
  return regions_.when_writes_end(region_id,
                                  [&loop = loop_, done = std::move(done)] { loop.post(done); });
}

void inproc_transport::async_write(std::span<const std::byte> local, const region_desc& remote,
                                   std::uint64_t offset, write_imm imm, completion done) {
  auto complete_with = [&](std::error_code ec) {
    loop_.post([done = std::move(done), ec] { done(ec); });
  };
  if (!regions_.contains(local)) return complete_with(transport_errc::not_registered);
  auto [peer, cut, _] = reach(remote.owner);
  if (!peer) {
    lost_on_the_way(remote.owner);
    return complete_with(transport_errc::peer_unreachable);
  }
  // A write held up by a cut is not under way: it is checked again when it arrives, however long
  // the cut lasts.
  auto target = cut ? peer->regions_.resolve(remote.id, remote.key, offset, local.size())
                    : peer->regions_.begin_write(remote.id, remote.key, offset, local.size());
  if (!target) return complete_with(target.error());

  const write_notice notice{
      .from = self_, .region = remote.id, .offset = offset, .length = local.size(), .imm = imm};
  if (cut) {
    // The bytes wait in "the kernel" (copied now), and are checked again on arrival.
    network_.hold(
        self_, remote.owner,
        [notice, key = remote.key,
         bytes = std::vector<std::byte>(local.begin(), local.end())](inproc_transport& at) {
          if (auto landing = at.regions_.resolve(notice.region, key, notice.offset, bytes.size())) {
            std::memcpy(landing->data(), bytes.data(), bytes.size());
            at.deliver_write(notice);
          }
        });
    return complete_with({});
  }
  if (network_.model_) {
    network_.model_(self_, remote.owner, local.size(), local.data(), target->data(),
                    [peer = std::move(peer), notice, done = std::move(done)] {
                      peer->regions_.end_write(notice.region);
                      peer->deliver_write(notice);
                      done({});
                    });
    return;
  }
  // The copy runs on a pool thread: it lands only while the region is registered, and its
  // deregistration waits for it, since the receiver may free the memory next.
  auto landed = std::make_shared<bool>(false);
  cpu_.async_run(
      local.size(),
      [peer, landed, notice, dst = *target, local] {
        *landed = peer->regions_.land(notice.region,
                                      [&] { std::memcpy(dst.data(), local.data(), local.size()); });
      },
      [peer, landed, notice, done = std::move(done)] {
        peer->regions_.end_write(notice.region);
        if (!*landed) return done(transport_errc::unknown_region);
        peer->loop_.post([peer, notice] { peer->deliver_write(notice); });
        done({});
      });
}

void inproc_transport::deliver_write(const write_notice& notice) {
  if (open_ && events_.on_write) events_.on_write(notice);
}

}  // namespace ferry
