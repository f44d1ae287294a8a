#include "sim/copy_model.hpp"

#include "sim/gpu_memory.hpp"

namespace ferry::sim {

copy_model::copy_model(flow_network& net, const cluster& cluster, unsigned gpu, route host)
    : net_(net),
      cluster_(cluster),
      gpu_(gpu),
      d2h_(cluster.offload(gpu)),
      h2d_(cluster.upload(gpu)),
      host_(std::move(host)) {
  d2d_.max_rate = device_copy_rate;
}

void copy_model::async_copy(std::vector<copy_piece> pieces, completion done) {
  queued copy{.done = std::move(done)};
  for (const auto& p : pieces) add(copy, p);
  queue_.push_back(std::move(copy));
  if (queue_.size() == 1) start_next();
}

void copy_model::add(queued& copy, const copy_piece& p) const {
  const bool from_device = gpu_addresses::on_device(p.src),
             to_device = gpu_addresses::on_device(p.dst);
  if (!from_device || !to_device) {
    copy.bytes[(from_device ? 2 : 0) + (to_device ? 1 : 0)] += p.bytes;
    return;
  }
  // Memory on `anywhere` stands for this engine's own GPU (a table of weights workers share).
  auto own = [this](unsigned gpu) { return gpu == gpu_addresses::anywhere ? gpu_ : gpu; };
  const auto from = own(gpu_addresses::gpu_of(p.src)), to = own(gpu_addresses::gpu_of(p.dst));
  if (from == to) {
    copy.bytes[3] += p.bytes;
    return;
  }
  for (auto& peer : copy.peers) {
    if (peer.from == from && peer.to == to) {
      peer.bytes += p.bytes;
      return;
    }
  }
  copy.peers.push_back({.from = from, .to = to, .bytes = p.bytes});
}

void copy_model::start_next() {
  auto& copy = queue_.front();
  const route* ways[4] = {&host_, &h2d_, &d2h_, &d2d_};
  for (int i = 0; i < 4; ++i) copy.moving += copy.bytes[i] > 0;
  copy.moving += static_cast<int>(copy.peers.size());
  auto finished = [this] {
    if (--queue_.front().moving > 0) return;
    auto done = std::move(queue_.front().done);
    queue_.pop_front();
    if (!queue_.empty()) start_next();
    done({});
  };
  if (copy.moving == 0) {
    copy.moving = 1;
    net_.start({}, finished);
    return;
  }
  for (int i = 0; i < 4; ++i)
    if (copy.bytes[i] > 0) net_.start(ways[i]->of(copy.bytes[i]), finished);
  for (const auto& peer : copy.peers)
    net_.start(cluster_.nvlink(peer.from, peer.to).of(peer.bytes), finished);
}

}  // namespace ferry::sim
