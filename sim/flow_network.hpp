#pragma once
/// A flow-level model of bulk transfers on virtual time: resources with rates (a PCIe direction,
/// a NIC, a socket's memory, a fabric), transfers that cross a path of them, rates shared max-min
/// fairly and recomputed whenever a transfer starts or ends. Far cheaper than packets and right
/// for the large, long transfers a weight update is made of.
#include <array>
#include <boost/container/static_vector.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/clock.hpp"

namespace ferry {
class event_loop;
}

namespace ferry::sim {

using resource_id = std::uint32_t;

/// One shared capacity and what crossed it.
struct resource {
  std::string name;
  double bytes_per_second = 0;
  double carried_bytes = 0;  ///< Weighted bytes that crossed it.
  clock::duration busy{};    ///< Time with at least one transfer on it.
};

/// A resource a transfer crosses; `weight` bytes of it per byte moved (a memcpy reads and writes
/// its socket's memory: weight 2).
struct hop {
  resource_id id = 0;
  double weight = 1;
};

/// The most resources one transfer crosses.
inline constexpr std::size_t max_hops = 8;
/// The resources a transfer crosses, held in place: hundreds of thousands start and end.
using path = boost::container::static_vector<hop, max_hops>;

struct transfer_spec {
  std::uint64_t bytes = 0;
  sim::path path;
  /// Fixed cost of the operation, added after its last byte moved.
  clock::duration latency{};
  /// A cap of its own (one copy thread's speed, one NCCL channel's); infinity when none.
  double max_rate = std::numeric_limits<double>::infinity();
};

/// Owning loop only; completions run on the loop. Uses the loop's clock, which must be virtual
/// for the model to mean anything (on real time it still runs, at the model's pace).
class flow_network {
 public:
  flow_network(event_loop& loop, ferry::clock& clock);
  flow_network(const flow_network&) = delete;
  flow_network& operator=(const flow_network&) = delete;
  ~flow_network();

  class clock& clock() {
    return clock_;
  }
  resource_id add_resource(std::string name, double bytes_per_second);
  const resource& at(resource_id id) const { return resources_[id]; }
  std::size_t resource_count() const { return resources_.size(); }
  std::vector<resource>& resources() { return resources_; }

  /// Starts moving `spec.bytes` across `spec.path`; `done()` runs once on the loop when the last
  /// byte arrived plus the latency. A transfer of no bytes, or with an empty path, takes only its
  /// latency. Returns the transfer's id.
  std::uint64_t start(transfer_spec spec, std::function<void()> done);

  /// The rate a transfer in flight has now (bytes/s), after any pending recomputation; 0 once done.
  double rate_of(std::uint64_t transfer);
  std::size_t in_flight() const { return live_.size(); }
  /// Brings every resource's carried bytes and busy time up to now.
  void settle();

  std::uint64_t transfers_started() const { return started_; }
  std::uint64_t recomputations() const { return recomputations_; }

 private:
  struct flow {
    std::uint64_t id = 0;  ///< 0: a free slot.
    double remaining = 0;  ///< as of `rates_since_`: rates change only then
    std::uint32_t live_place = 0;  ///< its place in `live_`
    double rate = 0;
    double max_rate = 0;
    sim::path path;
    /// Its place in each hop's resource's list of flows (`on_`), for removal in constant time.
    std::array<std::uint32_t, max_hops> place{};
    ferry::clock::duration latency{};
    std::function<void()> done;
  };

  /// Brings the resources' carried bytes and busy time up to now.
  void advance();
  void schedule_recompute();
  void recompute();
  void on_timer(std::uint64_t generation);
  /// Enters the flow in slot `slot` into, or takes it out of, the lists of the resources it crosses.
  void attach(std::uint32_t slot);
  void detach(std::uint32_t slot);
  /// Orders flow slots by their own cap, then by slot: the order of `capped_`.
  auto by_cap() const {
    return [this](std::uint32_t a, std::uint32_t b) {
      return flows_[a].max_rate != flows_[b].max_rate ? flows_[a].max_rate < flows_[b].max_rate : a < b;
    };
  }

  event_loop& loop_;
  ferry::clock& clock_;
  std::vector<resource> resources_;
  std::vector<flow> flows_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> live_;  ///< slots of transfers in flight, in no order
  ferry::clock::time_point last_{};
  /// When the rates were last set: each transfer's `remaining` is as of then.
  ferry::clock::time_point rates_since_{};
  /// Flow slots that may arrive when the timer fires, found by the recomputation that set it: a
  /// completion checks these, not every transfer in flight.
  std::vector<std::uint32_t> finishing_;
  std::uint64_t next_id_ = 1;
  std::uint64_t started_ = 0;
  std::uint64_t recomputations_ = 0;
  std::uint64_t timer_ = 0;
  std::uint64_t generation_ = 0;
  bool recompute_pending_ = false;
  bool timer_armed_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  // Kept as transfers start and end, per resource: the flows crossing it, their summed weight, and
  // its place in `busy_`, the resources some flow crosses. A recomputation reads these as they are.
  std::vector<std::vector<std::uint32_t>> on_;
  std::vector<double> weight_on_;
  std::vector<std::uint32_t> busy_place_;
  std::vector<resource_id> busy_;
  /// Slots of the transfers with a cap of their own, by cap, then slot: kept as they start and end.
  std::vector<std::uint32_t> capped_;
  // Scratch for the max-min computation, per resource unless said, kept to avoid allocating per
  // event.
  std::vector<double> capacity_left_, unfixed_weight_;
  std::vector<double> load_;            ///< weighted bytes/s crossing it at the current rates
  std::vector<std::uint64_t> fixed_in_;  ///< per flow slot: the recomputation that fixed its rate
  std::vector<std::uint32_t> fixing_;   ///< flow slots
  /// Resources still carrying unfixed transfers, and of those the ones a round may saturate.
  std::vector<resource_id> unfilled_, saturating_;
};

}  // namespace ferry::sim
