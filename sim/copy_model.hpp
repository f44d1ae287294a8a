#pragma once
/// A member's copy engine on the flow model: each piece goes the way its addresses say (host
/// memcpy, D2H, H2D, inside one GPU, or GPU to GPU over NVLink), costs its bytes there, and
/// moves no byte (the memory is sizes, `sim/gpu_memory.hpp`).
#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/copy_engine.hpp"
#include "sim/cluster.hpp"

namespace ferry::sim {

/// A copy inside one GPU's memory (apply from a device slot into the weights; a trainer's offload
/// into its device copies), bytes/s: shares no modelled resource.
inline constexpr double device_copy_rate = 2000e9;

/// Owning loop only; completions run on the loop.
class copy_model final : public copy_engine {
 public:
  /// The engine of a member on `gpu` of `cluster`: D2H and H2D over its PCIe, GPU to GPU from
  /// and to it over NVLink; `host` is its host memcpy.
  copy_model(flow_network& net, const cluster& cluster, unsigned gpu, route host);

  /// Copies run one after another, in the order they were asked for, as on the one CUDA stream
  /// of a GPU process's engine (and the one queue of a host engine's copy threads); run side by
  /// side, a hundred chunks landing at once would share the link and all finish late together.
  void async_copy(std::vector<copy_piece> pieces, completion done) override;

 private:
  /// Bytes from one GPU to another of the node (device-direct: a peer's device copies).
  struct peer_bytes {
    unsigned from = 0, to = 0;
    std::uint64_t bytes = 0;
  };
  struct queued {
    std::uint64_t bytes[4] = {};  ///< host, H2D, D2H, inside the device
    /// At most one pair in practice: a copy reads one chunk of one trainer.
    std::vector<peer_bytes> peers;
    completion done;
    int moving = 0;  ///< of its ways, those still moving
  };
  /// The count of `copy`'s bytes that go the way a piece from address range `from` to `to` goes
  /// (`gpu_addresses::range_of`).
  std::uint64_t& way(queued& copy, std::uint64_t from, std::uint64_t to);
  /// The copy at the front moves; it stays there until its last way is done.
  void start_next();

  flow_network& net_;
  const cluster& cluster_;
  std::uint64_t own_range_;  ///< this engine's GPU's, which `anywhere` stands for
  route d2h_, h2d_, host_, d2d_;
  std::deque<queued> queue_;
};

}  // namespace ferry::sim
