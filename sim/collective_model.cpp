#include "sim/collective_model.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

namespace ferry::sim {
namespace {

/// Starts one transfer per link; when all arrived, waits out the pipeline's fill, then `done`.
void run_links(flow_network& net, const std::vector<path>& links, std::uint64_t bytes,
               const pipeline_model& model, std::size_t fill_steps, clock& clock,
               std::function<void()> done) {
  if (links.empty() || bytes == 0) {
    clock.async_wait(clock::duration::zero(),
                     [done = std::move(done)](std::error_code) { done(); });
    return;
  }
  double slice_seconds = 0;
  const double slice = static_cast<double>(std::min(bytes, model.slice_bytes));
  for (const auto& link : links)
    slice_seconds = std::max(slice_seconds, slice / link_rate(net, link));
  const auto fill = static_cast<std::int64_t>(fill_steps) *
                    (clock::duration(static_cast<std::int64_t>(std::ceil(slice_seconds * 1e9))) +
                     model.per_link_latency);
  auto left = std::make_shared<std::size_t>(links.size());
  auto finish = std::make_shared<std::function<void()>>(
      [&clock, fill = model.per_link_latency + fill, done = std::move(done)] {
        clock.async_wait(fill, [done](std::error_code) { done(); });
      });
  for (const auto& link : links)
    net.start({.bytes = bytes, .path = link}, [left, finish] {
      if (--*left == 0) (*finish)();
    });
}

}  // namespace

double link_rate(const flow_network& net, const path& link) {
  double rate = std::numeric_limits<double>::infinity();
  for (const auto& h : link) rate = std::min(rate, net.at(h.id).bytes_per_second / h.weight);
  return rate;
}

void async_chain_broadcast(flow_network& net, const std::vector<path>& links, std::uint64_t bytes,
                           const pipeline_model& model, std::function<void()> done) {
  run_links(net, links, bytes, model, links.empty() ? 0 : links.size() - 1, net.clock(),
            std::move(done));
}

void async_ring_all_gather(flow_network& net, const std::vector<path>& links,
                           std::uint64_t total_bytes, const pipeline_model& model,
                           std::function<void()> done) {
  const auto n = links.size();
  const auto per_link = n == 0 ? 0 : total_bytes - total_bytes / n;
  // n-1 steps each pass a piece on; the pieces pipeline, so the fill is those steps' slices.
  run_links(net, links, per_link,
            {.slice_bytes = std::min(model.slice_bytes, n ? total_bytes / n : 0),
             .per_link_latency = model.per_link_latency},
            n >= 2 ? n - 2 : 0, net.clock(), std::move(done));
}

}  // namespace ferry::sim
