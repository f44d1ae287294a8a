#pragma once
/// Time for actors: real (steady clock, Asio timers) or virtual (advanced by a simulation).
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <system_error>
#include <vector>

namespace ferry {

class clock {
 public:
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  using handler = std::function<void(std::error_code)>;
  virtual ~clock() = default;

  virtual time_point now() const = 0;
  /// Calls `h({})` on the loop at `when`; `h(operation_aborted)` if cancelled. Returns a timer id.
  virtual std::uint64_t async_wait_until(time_point when, handler h) = 0;
  /// Cancels a pending timer; its handler runs with `operation_aborted`. Unknown ids are ignored.
  virtual void cancel(std::uint64_t timer) = 0;

  std::uint64_t async_wait(duration d, handler h) {
    return async_wait_until(now() + d, std::move(h));
  }
  /// Suspends the calling fiber for `d` (spawned fibers only).
  void sleep_for(duration d);
};

/// Wall time on the loop's io_context. Owning loop only.
class real_clock final : public clock {
 public:
  explicit real_clock(boost::asio::io_context& io) : io_(io) {}
  time_point now() const override;
  std::uint64_t async_wait_until(time_point when, handler h) override;
  void cancel(std::uint64_t timer) override;

 private:
  struct timer_state;
  boost::asio::io_context& io_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, std::shared_ptr<timer_state>> timers_;
};

/// Time that moves only when the simulation says so; timers fire in order as it advances, those
/// due at one instant in the order they were set. Owning loop only.
class virtual_clock final : public clock {
 public:
  explicit virtual_clock(boost::asio::io_context& io) : io_(io) {}
  time_point now() const override { return now_; }
  std::uint64_t async_wait_until(time_point when, handler h) override;
  void cancel(std::uint64_t timer) override;

  /// Moves time forward to `t`, posting the handler of every timer due by then to the loop.
  void advance_to(time_point t);
  /// Moves time to the earliest pending timer and runs the handlers of that instant's timers
  /// itself, in order; false if none is pending. For a loop with nothing else to run (its idle
  /// hook): the handlers then run in the order posting them would give, without a post each.
  bool advance_to_next();
  std::size_t pending() const { return slots_.size() - free_.size(); }

 private:
  // A timer's id is the order it was set in, above the slot holding its handler: ids order ties,
  // and a cancel finds its handler without a search. A simulation sets and cancels hundreds of
  // thousands of timers per simulated second.
  static constexpr unsigned slot_bits = 24;
  static constexpr std::uint64_t slot_mask = (std::uint64_t{1} << slot_bits) - 1;
  struct slot {
    std::uint64_t id = 0;  ///< 0: free
    handler h;
  };
  /// A timer in the queue; one cancelled stays there until it comes to the top or the queue is
  /// compacted, and is passed over as its slot no longer has its id.
  struct entry {
    time_point when;
    std::uint64_t id;
  };
  /// The heap's order: the earliest first, of one instant the first set.
  struct later {
    bool operator()(const entry& a, const entry& b) const {
      return a.when != b.when ? a.when > b.when : a.id > b.id;
    }
  };
  bool cancelled(const entry& e) const { return slots_[e.id & slot_mask].id != e.id; }
  void pop();
  handler release(std::uint64_t id);

  boost::asio::io_context& io_;
  time_point now_{};
  std::uint64_t next_order_ = 1;
  std::vector<entry> queue_;  ///< a heap, earliest (when, id) first
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
  std::vector<handler> firing_;  ///< `advance_to_next`'s, kept to avoid allocating per instant
};

}  // namespace ferry
