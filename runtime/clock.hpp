#pragma once
/// Time for actors: real (steady clock, Asio timers) or virtual (advanced by a simulation).
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <system_error>

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

  std::uint64_t async_wait(duration d, handler h) { return async_wait_until(now() + d, std::move(h)); }
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

/// Time that moves only when the simulation says so; timers fire in order as it advances.
/// Handlers are posted to the loop, so they never run inside `advance_to`. Owning loop only.
class virtual_clock final : public clock {
 public:
  explicit virtual_clock(boost::asio::io_context& io) : io_(io) {}
  time_point now() const override { return now_; }
  std::uint64_t async_wait_until(time_point when, handler h) override;
  void cancel(std::uint64_t timer) override;

  /// Moves time forward to `t`, firing every timer due by then.
  void advance_to(time_point t);
  /// Moves time to the earliest pending timer; false if none is pending.
  bool advance_to_next();
  std::size_t pending() const { return timers_.size(); }

 private:
  boost::asio::io_context& io_;
  time_point now_{};
  std::uint64_t next_id_ = 1;
  std::multimap<time_point, std::pair<std::uint64_t, handler>> timers_;
};

}  // namespace ferry
