#pragma once
/// Drives a provider's progress from the event loop. rxm and shm move bytes only while someone
/// polls (the target of a write included), so progress runs continuously while work is in
/// flight, unless the provider lets the loop sleep on its completion queue's wait fd; idle, it
/// sleeps on that fd, or polls on a timer that backs off.
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "runtime/event_loop.hpp"

namespace ferry::fabric_link {

/// Owning loop only; create with `std::make_shared`.
class progress_driver : public std::enable_shared_from_this<progress_driver> {
 public:
  struct hooks {
    std::function<int()> drain;       ///< reads completions and retries; how many it handled
    std::function<bool()> busy;       ///< work in flight, or waiting for the provider
    std::function<bool()> may_sleep;  ///< nothing moves until the wait fd fires (fi_trywait)
  };
  /// `wait_fd` < 0: the provider gives none, and a timer alone wakes progress when idle.
  progress_driver(event_loop& loop, int wait_fd, hooks h);

  bool has_wait_fd() const { return wait_fd_.has_value(); }
  void start();
  /// Drives progress now and decides how to be woken next.
  void kick();
  /// New work was issued from outside a drain: progress runs continuously again.
  void poke();
  /// Before the completion queue closes: the fd is its, so it is released, not closed.
  void stop();

 private:
  /// Work in flight, or traffic within `active_window`: progress must run continuously.
  bool hot() const;
  void start_pump();
  bool arm_wait_fd();
  void rearm();
  void arm_timer(std::chrono::steady_clock::duration after);

  event_loop& loop_;
  hooks hooks_;
  boost::asio::steady_timer timer_;
  std::chrono::steady_clock::time_point timer_deadline_{};
  bool timer_armed_ = false;
  std::optional<boost::asio::posix::stream_descriptor> wait_fd_;
  bool fd_armed_ = false;
  unsigned idle_streak_ = 0;
  bool running_ = false;
  bool pumping_ = false;      ///< a pump fiber is alive
  bool kick_posted_ = false;  ///< the pump's kick is queued and has not run yet
  std::chrono::steady_clock::time_point active_until_{};
};

}  // namespace ferry::fabric_link
