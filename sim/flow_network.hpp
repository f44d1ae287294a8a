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
#include <span>
#include <string>
#include <vector>

#include "runtime/clock.hpp"

namespace ferry {
class event_loop;
}

namespace ferry::sim {

using resource_id = std::uint32_t;

/// One shared capacity.
struct resource {
  std::string name;
  double bytes_per_second = 0;
};

/// What crossed a resource, up to its last change (or `flow_network::settle`).
struct resource_usage {
  double carried_bytes = 0;  ///< Weighted bytes that crossed it.
  clock::duration busy{};    ///< Time with at least one transfer on it.
};

/// A resource a transfer crosses; `weight` bytes of it per byte moved (a memcpy reads and writes
/// its socket's memory: weight 2). A float holds such small ratios exactly, and makes a hop 8 bytes
/// with no padding: a route built on the stack and copied out read padding the stores had not
/// written, and waited for them (3% of `perf` samples in `cluster::network` at 64 GPUs).
struct hop {
  resource_id id = 0;
  float weight = 1;
};

/// The most resources one transfer crosses.
inline constexpr std::size_t max_hops = 6;
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
  resource_usage usage(resource_id id) const { return {state_[id].carried_bytes, state_[id].busy}; }
  std::size_t resource_count() const { return resources_.size(); }

  /// Starts moving `spec.bytes` across `spec.path`; `done()` runs once on the loop when the last
  /// byte arrived plus the latency. A transfer of no bytes, or with an empty path and no cap, takes
  /// only its latency; one with an empty path and a cap moves at its cap, shares nothing, and is
  /// not counted in flight. Returns the transfer's id.
  std::uint64_t start(transfer_spec spec, std::function<void()> done);

  /// The rate a transfer in flight has now (bytes/s), after any pending recomputation; 0 once done.
  double rate_of(std::uint64_t transfer);
  std::size_t in_flight() const { return live_.size(); }
  /// Brings every resource's carried bytes and busy time up to now.
  void settle();

  std::uint64_t transfers_started() const { return started_; }
  std::uint64_t recomputations() const { return recomputations_; }

 private:
  /// What limits a transfer's rate: a resource's id, or one of these.
  static constexpr std::int32_t own_cap = -1;
  static constexpr std::int32_t unsolved = -2;
  static constexpr std::uint32_t nowhere = ~std::uint32_t{0};

  /// A transfer in flight as the solver and the timer read it, two cache lines. A recomputation
  /// reads a transfer's rate, cap, bottleneck and hops: the first line holds them for a path of up
  /// to five hops (a route between nodes has four). At 384 GPUs the solver's time went to reading
  /// transfers scattered over `flows_`, several cache lines of each; what only a transfer's start
  /// and end need is apart, in `endings_`.
  struct alignas(64) flow {
    double rate = 0;
    double max_rate = 0;
    std::int32_t bottleneck = unsolved;
    std::uint32_t hop_count = 0;
    std::array<hop, max_hops> path;
    std::span<const hop> hops() const { return {path.data(), hop_count}; }

    std::uint64_t id = 0;          ///< 0: a free slot.
    double remaining = 0;          ///< bytes left as of `since`, when its rate last changed
    double since = 0;              ///< virtual ns
    std::uint32_t live_place = 0;  ///< its place in `live_`
    /// Its place in each hop's resource's list of crossings (`on_`), for removal in constant
    /// time.
    std::array<std::uint32_t, max_hops> place{};
  };
  static_assert(sizeof(flow) == 128);
  /// The rest of a slot: what runs when its transfer is done.
  struct ending {
    ferry::clock::duration latency{};
    /// Its timer once its last byte arrived (or, with no path, to its arrival), else 0: it keeps
    /// its slot until then, and the timer's handler carries no more than the slot.
    std::uint64_t waiting = 0;
    std::function<void()> done;
  };

  double now_ns() const;
  std::uint32_t take_slot(std::uint64_t id, ferry::clock::duration latency,
                          std::function<void()> done);
  /// Runs the transfer's completion after its latency, from now.
  void wait_latency(std::uint32_t slot);
  void finish(std::uint32_t slot);
  void free_slot(std::uint32_t slot);
  /// Adds a resource's carried bytes and busy time up to now, before its load or flows change;
  /// only while a transfer is on it (idle, only `accounted` moves).
  void account(resource_id r, double now);
  void schedule_recompute();
  void recompute();
  void on_timer();
  /// Enters the flow in slot `slot` into, or takes it out of, the lists of the resources it
  /// crosses.
  void attach(std::uint32_t slot);
  void detach(std::uint32_t slot);
  // The region a recomputation re-solves, the rest held at their rates.
  void add_to_region(std::uint32_t slot);
  /// The transfers bottlenecked at `r`.
  void add_group(resource_id r);
  void fill_region();
  /// Adds to the region what its new rates would leave unfair; false when nothing.
  bool grow_region();
  double fair_level(resource_id r, double level);
  void commit_region(double now);
  // When each transfer in flight that moves will have moved its last byte (virtual ns; infinity
  // while it does not move), kept by its place in `live_`, and the soonest of each block of
  // `due_block` places. A re-solve moves the due times of ~130 transfers at once at 384 GPUs: in
  // a binary heap that was 7% of the steady `perf` samples, and a lazy heap (push the new time,
  // skip the stale one) was worse. Here a change writes one number and at most rescans its block;
  // the soonest is a scan of the blocks' soonest. Blocks of 16 rather than 64: a version at 384
  // GPUs rescans a block ~2.9 M times, and scanning the ~500 blocks' soonest per recomputation
  // costs less than that saves.
  static constexpr std::size_t due_block = 16;
  void due_set(std::uint32_t slot, double at);
  void due_erase(std::uint32_t slot) { due_set(slot, std::numeric_limits<double>::infinity()); }
  void due_rescan(std::size_t block);
  /// When the first transfer's last byte arrives; infinity when none moves.
  double due_soonest() const;
  /// Takes the transfer in slot `slot` out of `live_`, with its due time, the last one taking its
  /// place.
  void leave_live(std::uint32_t slot);
  void arm_timer();

  event_loop& loop_;
  ferry::clock& clock_;
  std::vector<resource> resources_;
  std::vector<flow> flows_;
  std::vector<ending> endings_;  ///< by slot, as `flows_`
  /// Free slots, the lowest taken first, so that the transfers in flight stay packed at the front
  /// of `flows_`: the first burst of sends at 384 GPUs takes 131,072 slots, and ~7,600 are in
  /// flight after it.
  class free_slots {
   public:
    void add(std::uint32_t slot);
    /// The lowest free slot, taken; `nowhere` when none.
    std::uint32_t take();

   private:
    std::vector<std::uint64_t> words_;  ///< bit s of word s/64: slot s is free
    std::vector<std::uint64_t> any_;    ///< bit w of word w/64: word w has a free slot
  };
  free_slots free_;
  std::vector<std::uint32_t> live_;  ///< slots of transfers in flight, in no order
  std::vector<double> due_at_, due_soonest_;
  std::uint64_t next_id_ = 1;
  std::uint64_t started_ = 0;
  std::uint64_t recomputations_ = 0;
  std::uint64_t timer_ = 0;
  std::uint64_t generation_ = 0;
  std::int64_t timer_at_ = 0;  ///< virtual ns
  bool recompute_pending_ = false;
  bool timer_armed_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  /// Since the last recomputation: transfers started, and resources that lost a transfer while
  /// others stay bottlenecked there.
  std::vector<std::uint32_t> started_now_;
  std::vector<resource_id> freed_;
  std::vector<std::function<void()>> finished_;  ///< `on_timer`'s, kept to avoid allocating

  /// Per resource: the transfers crossing it (their slots, and which hop of theirs), kept as
  /// transfers start and end.
  struct crossing {
    std::uint32_t slot, hop;
  };
  std::vector<std::vector<crossing>> on_;
  /// What a recomputation reads of a resource, side by side: the first cache line is what a filling
  /// touches per hop.
  struct alignas(64) resource_state {
    double capacity = 0;  ///< bytes/s
    double load = 0;      ///< weighted bytes/s crossing it at the current rates
    // A filling's scratch: capacity left, unfixed weight, the weight of the region transfers
    // bottlenecked here before, the level at which the filling bottlenecked region transfers here
    // (-1: none), and its region transfers (`region_count` from `region_on_[region_begin]`).
    double capacity_left = 0, unfixed_weight = 0, region_own = 0, saturated_at = 0;
    std::uint32_t region_begin = 0, region_count = 0;
    std::uint64_t reached_in = 0;  ///< the filling that reached it
    // Kept: the weight of the transfers bottlenecked here and their rate, a rate no transfer on it
    // exceeds (exact after a `fair_level`, else a bound), and up to when (virtual ns) its carried
    // bytes and busy time were added up: the second line, with the usage itself. A transfer's
    // start, end and new rate account each hop, and the usage kept apart in `resources_` was a
    // cold line more per hop (a sixth of `account`'s samples at 384 GPUs).
    double own_weight = 0, level = 0, fastest = 0, accounted = 0;
    std::uint64_t grouped_in = 0;  ///< the recomputation whose region took its group
    double carried_bytes = 0;
    clock::duration busy{};
  };
  static_assert(sizeof(resource_state) == 128);
  std::vector<resource_state> state_;

  // Scratch of a recomputation, kept to avoid allocating per event.
  std::uint64_t stamp_ = 0;  ///< the recomputation's number
  std::uint64_t fill_ = 0;   ///< one filling of the region
  std::vector<std::uint32_t> region_, capped_, fixing_, arrived_;
  /// Per flow slot: the recomputation that put it in the region, the filling that fixed it, its
  /// new rate and bottleneck; side by side, one read for the four.
  struct solving {
    std::uint64_t in_region = 0, fixed_in = 0;
    double new_rate = 0;
    std::int32_t new_bottleneck = unsolved;
  };
  std::vector<solving> solving_;
  std::vector<std::uint32_t> region_on_;
  std::vector<resource_id> reached_, unfilled_, saturating_;
  /// For `fair_level`: the transfers on a resource that do not rise with it, `slot` those held.
  struct share {
    double rate, weight;
    std::uint32_t slot;
  };
  std::vector<share> shares_;
};

}  // namespace ferry::sim
