#pragma once
/// What a fabric endpoint has outstanding towards each peer, and which peers stalled. Operations
/// the provider refused (-FI_EAGAIN) wait per peer, in order: a peer that stopped taking them (a
/// dead shm process) holds up only its own. Time comes in as an argument, so the accounting runs
/// on virtual time in tests.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "runtime/message.hpp"

namespace ferry::fabric_link {

/// A send or write waiting for the provider to accept it.
struct waiting_op {
  enum class kind : std::uint8_t { send, write } what;
  std::uint64_t id;
};

/// Owning loop only.
class peer_traffic {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  /// The provider accepted an operation to `peer`.
  void accepted(node_id peer, time_point now);
  /// An operation the provider accepted completed; one of a peer given up on counts apart.
  void completed(node_id peer, bool abandoned, time_point now);
  /// `peer` took something that has no completion.
  void progressed(node_id peer, time_point now) { peers_[peer].last_progress = now; }
  /// `op` waits behind whatever else waits for `peer`.
  void wait(node_id peer, waiting_op op, time_point now);
  /// A send in flight to `peer` that later traffic must not overtake (`holds_order`), and its end.
  void hold_order(node_id peer) { ++peers_[peer].order_holders; }
  void release_order(node_id peer) { --peers_[peer].order_holders; }

  /// Something waits for `peer`, or holds its order: new traffic queues behind it.
  bool must_wait(node_id peer) const;
  /// Work the provider holds for live peers, or operations waiting.
  bool busy() const { return in_flight_ > abandoned_in_flight_ || waiting_ > 0; }

  /// Retries each peer's waiting operations in order while `may_send(peer)` and `retry(op)`
  /// (false: the provider still refuses it).
  template <class MaySend, class Retry>
  void retry_waiting(MaySend may_send, Retry retry);

  /// Gives `peer` up: what waits for it is dropped, and what the provider holds no longer counts
  /// as busy until it completes, if ever.
  void forget(node_id peer);
  /// Peers with work outstanding that took nothing for `timeout`; checked once per
  /// `check_period`, so most calls return nothing at once.
  struct stalled_peer {
    node_id peer;
    std::size_t waiting;
    std::uint32_t in_flight;
  };
  std::vector<stalled_peer> stalled(time_point now, std::chrono::milliseconds timeout);
  void clear();

  static constexpr auto check_period = std::chrono::milliseconds(250);

 private:
  struct one_peer {
    std::deque<waiting_op> waiting;
    std::uint32_t in_flight = 0;      ///< accepted by the provider, not yet completed
    std::uint32_t order_holders = 0;  ///< sends in flight that later traffic must not overtake
    time_point last_progress{};
    bool idle() const { return waiting.empty() && in_flight == 0; }
  };

  std::map<node_id, one_peer> peers_;  // a map: retrying may touch entries while iterating
  std::size_t waiting_ = 0;            ///< in every peer's `waiting`
  std::size_t in_flight_ = 0;
  std::size_t abandoned_in_flight_ = 0;  ///< of `in_flight_`: ops of peers given up on
  time_point next_check_{};
};

template <class MaySend, class Retry>
void peer_traffic::retry_waiting(MaySend may_send, Retry retry) {
  for (auto& [peer, p] : peers_) {
    while (!p.waiting.empty() && p.order_holders == 0 && may_send(peer) &&
           retry(p.waiting.front())) {
      p.waiting.pop_front();
      --waiting_;
    }
  }
}

}  // namespace ferry::fabric_link
