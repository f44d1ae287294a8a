#pragma once
/// NCCL's broadcast and all-gather as the pipelined chain and ring they are, on the flow model:
/// in the pipeline's steady state every link carries its bytes at once, so each link is one
/// transfer sharing the resources it crosses; filling the pipeline adds one slice's trip per
/// link after the first.
#include <functional>
#include <vector>

#include "sim/flow_network.hpp"

namespace ferry::sim {

/// How the pipeline is cut and what each step of it costs.
struct pipeline_model {
  std::uint64_t slice_bytes = 1 << 20;
  clock::duration per_link_latency{};
};

/// The time one slice takes across `link` alone: its slowest resource, weighted.
double link_rate(const flow_network& net, const path& link);

/// Broadcasts `bytes` along a chain; `links[i]` is the path from rank i to rank i+1. `done()` on
/// the loop when the last rank holds every byte. No links: done after no time.
void async_chain_broadcast(flow_network& net, const std::vector<path>& links, std::uint64_t bytes,
                           const pipeline_model& model, std::function<void()> done);

/// All-gathers `total_bytes` (each of the ring's n ranks holds 1/n) around a ring; `links[i]` is
/// the path from rank i to rank (i+1) mod n: each carries (n-1)/n of the total.
void async_ring_all_gather(flow_network& net, const std::vector<path>& links,
                           std::uint64_t total_bytes, const pipeline_model& model,
                           std::function<void()> done);

}  // namespace ferry::sim
