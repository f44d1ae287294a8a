#pragma once
/// Waiting, from a fiber, for a completion delivered on the event loop.
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/future.hpp>
#include <memory>
#include <tuple>
#include <utility>

namespace ferry {

/// Starts an operation and suspends the calling fiber until its handler runs.
/// `start(handler)` must arrange for `handler(args...)` to be called exactly once, on the loop
/// thread. Returns the arguments as a tuple. Call from a spawned fiber, never from a handler.
template <class... Args, class Start>
std::tuple<Args...> await(Start&& start) {
  auto promise = std::make_shared<boost::fibers::promise<std::tuple<Args...>>>();
  auto future = promise->get_future();
  std::forward<Start>(start)([promise](Args... args) mutable {
    promise->set_value(std::tuple<Args...>(std::move(args)...));
  });
  return future.get();
}

/// The lock of state that only one loop's fibers touch. They all run on the loop's thread and
/// switch only where one waits, so such state needs no exclusion; Boost's condition variables
/// still want a lock to wait with. A fiber mutex there cost atomics at every message and wait.
struct loop_confined {
  void lock() noexcept {}
  void unlock() noexcept {}
};

/// A counting semaphore for fibers of one loop: the "slots" of a pipeline stage.
/// Owning loop only.
class slot_counter {
 public:
  explicit slot_counter(std::size_t free) : free_(free) {}
  /// Suspends the fiber until a slot is free, then takes it.
  void acquire() {
    std::unique_lock lock(confined_);
    cv_.wait(lock, [this] { return free_ > 0; });
    --free_;
  }
  /// Gives a slot back; may be called from a handler (it never blocks for long).
  void release() {
    ++free_;
    cv_.notify_one();
  }
  std::size_t available() const { return free_; }

 private:
  std::size_t free_;
  loop_confined confined_;
  boost::fibers::condition_variable_any cv_;
};

}  // namespace ferry
