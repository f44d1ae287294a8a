#pragma once
/// A cluster's hardware as resources of a flow network, and the routes a chunk takes through
/// them: offload (D2H), upload (H2D), host copies, the network between nodes, NVLink.
#include <optional>
#include <string>
#include <vector>

#include "runtime/device_memory.hpp"
#include "sim/flow_network.hpp"

namespace ferry::sim {

/// Rates in bytes per second, per direction where a resource has two.
struct hardware {
  unsigned nodes = 1;
  unsigned gpus_per_node = 8;
  unsigned sockets_per_node = 2;
  unsigned nics_per_node = 8;
  double nic_rate = 50e9;
  double pcie_d2h_rate = 55e9;  ///< Per GPU, one direction alone.
  double pcie_h2d_rate = 55e9;
  double pcie_duplex_rate = 92e9;             ///< Per GPU, both directions together.
  double host_memory_rate = 200e9;            ///< Per socket: bytes read plus bytes written.
  double nvlink_rate = 450e9;                 ///< Per GPU and direction.
  std::uint64_t host_memory = 2048ull << 30;  ///< Per node: what its members may hold.
  std::uint64_t gpu_memory = 80ull << 30;     ///< Per GPU.
  /// The GPUs of a node read each other's memory over NVLink (peer access); without it, a GPU
  /// reads only its own, and device-direct P2P never pairs two GPUs.
  bool peer_access = true;
  /// NICs read and write GPU memory (GPUDirect RDMA): writes between GPUs on different nodes skip
  /// host memory, and trainers and leaders stage there no more.
  bool gpudirect = false;
  double fabric_oversubscription = 1;  ///< Core capacity = all NICs' rate / this.
  unsigned copy_threads = 4;           ///< Per node.
  double copy_thread_rate = 10e9;      ///< One thread's memcpy.
  clock::duration pcie_latency{std::chrono::microseconds(10)};
  clock::duration nic_latency{std::chrono::microseconds(5)};
  clock::duration nvlink_latency{std::chrono::microseconds(3)};
  clock::duration copy_latency{std::chrono::microseconds(2)};
};

/// A way through the cluster: the resources crossed, a cap of the transfer's own, its latency.
struct route {
  sim::path path;
  double max_rate = std::numeric_limits<double>::infinity();
  clock::duration latency{};

  transfer_spec of(std::uint64_t bytes) const { return {bytes, path, latency, max_rate}; }
};

/// GPUs are numbered node by node: gpu = node * gpus_per_node + local index.
class cluster {
 public:
  cluster(flow_network& net, const hardware& hw);

  const hardware& spec() const { return hw_; }
  unsigned gpus() const { return hw_.nodes * hw_.gpus_per_node; }
  unsigned node_of(unsigned gpu) const { return places_[gpu].node; }
  unsigned socket_of(unsigned gpu) const { return places_[gpu].socket; }
  unsigned nic_of(unsigned gpu) const { return places_[gpu].nic; }
  /// Where a member on `gpu` says its tensors live: its node (plus one: 0 means unknown) as the
  /// host, the GPU's name, and the GPUs it reads (every GPU of the node with peer access).
  device_place place_of(unsigned gpu) const;

  /// Device to the pinned host copy on the GPU's socket.
  route offload(unsigned gpu) const;
  /// Host staging on the GPU's socket to the device.
  route upload(unsigned gpu) const;
  /// A memcpy on `node`'s socket by one copy thread (reads and writes that memory).
  route host_copy(unsigned node, unsigned socket) const;
  /// Host memory of `from`'s node to host memory of `to`'s node through their NICs (RDMA). On one
  /// node: a copy through that socket's memory, split over all of the node's copy threads.
  route network(unsigned from, unsigned to) const;
  /// GPU to GPU of one node (NVLink tx of `from`, rx of `to`); across nodes: the network path
  /// between their hosts' NICs.
  route nvlink(unsigned from, unsigned to) const;
  /// A NIC's write from GPU `from`'s memory (`from_device`) or its socket's, into GPU `to`'s
  /// memory (`to_device`) or its socket's: GPUDirect RDMA, across `from`'s and `to`'s PCIe links.
  route rdma(unsigned from, unsigned to, bool from_device, bool to_device) const;

 private:
  hardware hw_;
  /// Per GPU, its node, socket and NIC (numbered over the cluster): looked up for every bulk
  /// write, where the divisions that find them cost 1-2% at 384 GPUs.
  struct place {
    unsigned node, socket, nic;
  };
  std::vector<place> places_;
  std::vector<resource_id> d2h_, h2d_, duplex_, nvlink_tx_, nvlink_rx_;  // per GPU
  std::vector<resource_id> memory_;                                      // per socket
  std::vector<resource_id> nic_tx_, nic_rx_;                             // per NIC
  std::vector<resource_id> copy_threads_;                                // per node
  std::optional<resource_id> fabric_;  ///< only when oversubscribed
};

/// Why `hw` cannot describe a cluster, naming the field; empty when it can.
std::string validate(const hardware& hw);

}  // namespace ferry::sim
