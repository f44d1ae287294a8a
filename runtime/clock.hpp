#pragma once
/// Time for actors: real (steady clock, Asio timers) or virtual (advanced by a simulation).
#include <array>
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
  /// The order of firing: the earliest first, of one instant the first set.
  static bool earlier(const entry& a, const entry& b) {
    return a.when != b.when ? a.when < b.when : a.id < b.id;
  }
  /// The pending timers, soonest first. Most of a simulation's timers wait one of a few fixed
  /// delays (the modelled latencies: 94% of them at 384 GPUs wait one of four), and timers of one
  /// delay come due in the order they were set, as time only moves forward: each such delay gets
  /// a lane, a FIFO, and only the rest sift through a heap (which a push near the front, as a short
  /// delay is, climbs all the way up).
  class timer_queue {
   public:
    /// `e` was set `delay` after now.
    void push(const entry& e, duration delay);
    bool empty() const { return size_ == 0; }
    std::size_t size() const { return size_; }
    const entry& top() const {
      return soonest_ == lane_count ? heap_.front() : lanes_[soonest_].front();
    }
    void pop();
    /// Removes every entry `gone` says, keeping the order of the rest.
    void erase_if(const std::function<bool(const entry&)>& gone);

   private:
    static constexpr std::size_t lane_count = 4;
    struct lane {
      duration delay{-1};  ///< none while negative
      std::vector<entry> entries;
      std::size_t head = 0;  ///< entries before it have left
      bool empty() const { return head == entries.size(); }
      const entry& front() const { return entries[head]; }
      void pop();
    };
    struct later {
      bool operator()(const entry& a, const entry& b) const { return earlier(b, a); }
    };
    /// Where the soonest entry waits: a lane, or `lane_count` for the heap.
    void find_soonest();

    std::vector<entry> heap_;
    std::array<lane, lane_count> lanes_;
    /// A delay without a lane that the heap's last push had too: a second one in a row takes an
    /// empty lane, so one-off delays (a flow network's next arrival) do not take lanes.
    duration heap_delay_{-1};
    std::size_t soonest_ = lane_count;
    std::size_t size_ = 0;
  };
  bool cancelled(const entry& e) const { return slots_[e.id & slot_mask].id != e.id; }
  handler release(std::uint64_t id);

  boost::asio::io_context& io_;
  time_point now_{};
  std::uint64_t next_order_ = 1;
  timer_queue queue_;
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
  std::vector<handler> firing_;  ///< `advance_to_next`'s, kept to avoid allocating per instant
};

}  // namespace ferry
