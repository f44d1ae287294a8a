#include "sim/cluster.hpp"

#include <fmt/format.h>

#include <cmath>

#include "sim/gpu_memory.hpp"

namespace ferry::sim {

cluster::cluster(flow_network& net, const hardware& hw) : hw_(hw) {
  for (unsigned g = 0; g < gpus(); ++g) {
    const auto node = g / hw.gpus_per_node, local = g % hw.gpus_per_node;
    places_.push_back(
        {.node = node,
         .socket = node * hw.sockets_per_node + local * hw.sockets_per_node / hw.gpus_per_node,
         .nic = node * hw.nics_per_node + local * hw.nics_per_node / hw.gpus_per_node});
    d2h_.push_back(net.add_resource(fmt::format("gpu{} pcie d2h", g), hw.pcie_d2h_rate));
    h2d_.push_back(net.add_resource(fmt::format("gpu{} pcie h2d", g), hw.pcie_h2d_rate));
    duplex_.push_back(net.add_resource(fmt::format("gpu{} pcie duplex", g), hw.pcie_duplex_rate));
    nvlink_tx_.push_back(net.add_resource(fmt::format("gpu{} nvlink tx", g), hw.nvlink_rate));
    nvlink_rx_.push_back(net.add_resource(fmt::format("gpu{} nvlink rx", g), hw.nvlink_rate));
  }
  for (unsigned n = 0; n < hw.nodes; ++n) {
    for (unsigned s = 0; s < hw.sockets_per_node; ++s)
      memory_.push_back(
          net.add_resource(fmt::format("node{} socket{} memory", n, s), hw.host_memory_rate));
    for (unsigned i = 0; i < hw.nics_per_node; ++i) {
      nic_tx_.push_back(net.add_resource(fmt::format("node{} nic{} tx", n, i), hw.nic_rate));
      nic_rx_.push_back(net.add_resource(fmt::format("node{} nic{} rx", n, i), hw.nic_rate));
    }
    copy_threads_.push_back(net.add_resource(fmt::format("node{} copy threads", n),
                                             hw.copy_threads * hw.copy_thread_rate));
  }
  // A non-blocking fabric carries every NIC at full rate, so it never binds: left out of the
  // paths, it costs no hop on every transfer between nodes.
  if (hw.fabric_oversubscription > 1)
    fabric_ = net.add_resource(
        "switch fabric", hw.nodes * hw.nics_per_node * hw.nic_rate / hw.fabric_oversubscription);
}

route cluster::rdma(unsigned from, unsigned to, bool from_device, bool to_device) const {
  route r{.latency = hw_.nic_latency};
  if (from_device) {
    r.path = {{d2h_[from]}, {duplex_[from]}};
  } else {
    r.path = {{memory_[socket_of(from)]}};
  }
  r.path.push_back({nic_tx_[nic_of(from)]});
  r.path.push_back({nic_rx_[nic_of(to)]});
  if (to_device) {
    r.path.push_back({h2d_[to]});
    r.path.push_back({duplex_[to]});
  } else {
    r.path.push_back({memory_[socket_of(to)]});
  }
  if (fabric_) r.path.push_back({*fabric_});
  return r;
}

device_place cluster::place_of(unsigned gpu) const {
  device_place at{.host = node_of(gpu) + 1ull, .gpu = gpu_name(gpu)};
  if (!hw_.peer_access) {
    at.reads = {at.gpu};
    return at;
  }
  const auto first = node_of(gpu) * hw_.gpus_per_node;
  for (unsigned g = first; g < first + hw_.gpus_per_node; ++g) at.reads.push_back(gpu_name(g));
  return at;
}

route cluster::offload(unsigned gpu) const {
  return {.path = {{d2h_[gpu]}, {duplex_[gpu]}, {memory_[socket_of(gpu)]}},
          .latency = hw_.pcie_latency};
}

route cluster::upload(unsigned gpu) const {
  return {.path = {{h2d_[gpu]}, {duplex_[gpu]}, {memory_[socket_of(gpu)]}},
          .latency = hw_.pcie_latency};
}

route cluster::host_copy(unsigned node, unsigned socket) const {
  return {.path = {{memory_[node * hw_.sockets_per_node + socket], 2}, {copy_threads_[node]}},
          .max_rate = hw_.copy_thread_rate,
          .latency = hw_.copy_latency};
}

route cluster::network(unsigned from, unsigned to) const {
  if (node_of(from) == node_of(to)) {
    // A copy between processes (cma, shared memory): split over every copy thread of the node.
    route r{.path = {{memory_[socket_of(from)], 2}, {copy_threads_[node_of(from)]}},
            .latency = hw_.copy_latency};
    if (socket_of(from) != socket_of(to))
      r.path = {
          {memory_[socket_of(from)]}, {memory_[socket_of(to)]}, {copy_threads_[node_of(from)]}};
    return r;
  }
  route r{.path = {{memory_[socket_of(from)]},
                   {nic_tx_[nic_of(from)]},
                   {nic_rx_[nic_of(to)]},
                   {memory_[socket_of(to)]}},
          .latency = hw_.nic_latency};
  if (fabric_) r.path.push_back({*fabric_});
  return r;
}

route cluster::nvlink(unsigned from, unsigned to) const {
  if (node_of(from) != node_of(to)) return network(from, to);
  return {.path = {{nvlink_tx_[from]}, {nvlink_rx_[to]}}, .latency = hw_.nvlink_latency};
}

std::string validate(const hardware& hw) {
  const auto positive = [](double v) { return v > 0 && std::isfinite(v); };
  if (hw.nodes == 0) return "hardware.nodes: must be at least 1";
  if (hw.gpus_per_node == 0) return "hardware.gpus_per_node: must be at least 1";
  if (hw.sockets_per_node == 0) return "hardware.sockets_per_node: must be at least 1";
  if (hw.nics_per_node == 0) return "hardware.nics_per_node: must be at least 1";
  if (hw.copy_threads == 0) return "hardware.copy_threads: must be at least 1";
  if (std::uint64_t{hw.nodes} * hw.gpus_per_node > gpu_addresses::max_gpus)
    return fmt::format("hardware.nodes x hardware.gpus_per_node: at most {} GPUs",
                       gpu_addresses::max_gpus);
  const std::pair<const char*, double> rates[] = {{"hardware.nic_gbps", hw.nic_rate},
                                                  {"hardware.pcie_d2h", hw.pcie_d2h_rate},
                                                  {"hardware.pcie_h2d", hw.pcie_h2d_rate},
                                                  {"hardware.pcie_duplex", hw.pcie_duplex_rate},
                                                  {"hardware.host_memory", hw.host_memory_rate},
                                                  {"hardware.nvlink", hw.nvlink_rate},
                                                  {"hardware.copy_thread", hw.copy_thread_rate}};
  for (const auto& [name, v] : rates)
    if (!positive(v)) return fmt::format("{}: a rate must be positive", name);
  if (!(hw.fabric_oversubscription >= 1))
    return "hardware.fabric_oversubscription: must be at least 1";
  return {};
}

}  // namespace ferry::sim
