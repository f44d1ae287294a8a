#include "sim/copy_model.hpp"

#include "sim/gpu_memory.hpp"

namespace ferry::sim {

copy_model::copy_model(flow_network& net, const cluster& cluster, unsigned gpu, route host)
    : net_(net),
      cluster_(cluster),
      own_range_(gpu_addresses::range_of_gpu(gpu)),
      d2h_(cluster.offload(gpu)),
      h2d_(cluster.upload(gpu)),
      host_(std::move(host)) {
  d2d_.max_rate = device_copy_rate;
}

void copy_model::async_copy(std::vector<copy_piece> pieces, completion done) {
  auto& copy = queue_.emplace_back();
  copy.done = std::move(done);
  // A copy's pieces mostly share their ranges (an apply's, from one slot into one table): each
  // pair of ranges is looked at once, which keeps a piece's cost to two shifts and a sum.
  std::uint64_t from = gpu_addresses::no_range, to = gpu_addresses::no_range, *bytes = nullptr;
  for (const auto& p : pieces) {
    const auto f = gpu_addresses::range_of(p.src), t = gpu_addresses::range_of(p.dst);
    if (f != from || t != to) {
      from = f;
      to = t;
      bytes = &way(copy, f, t);
    }
    *bytes += p.bytes;
  }
  if (queue_.size() == 1) start_next();
}

std::uint64_t& copy_model::way(queued& copy, std::uint64_t from, std::uint64_t to) {
  // Memory on `anywhere` stands for this engine's own GPU (a table of weights workers share).
  auto own = [this](std::uint64_t r) {
    return r == gpu_addresses::anywhere_range ? own_range_ : r;
  };
  from = own(from);
  to = own(to);
  const bool from_device = from >= gpu_addresses::anywhere_range,
             to_device = to >= gpu_addresses::anywhere_range;
  if (from == to || !from_device || !to_device)
    return copy.bytes[(from_device ? 2 : 0) + (to_device ? 1 : 0)];
  const auto a = gpu_addresses::gpu_of_range(from), b = gpu_addresses::gpu_of_range(to);
  for (auto& peer : copy.peers)
    if (peer.from == a && peer.to == b) return peer.bytes;
  return copy.peers.emplace_back(peer_bytes{.from = a, .to = b}).bytes;
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
