#pragma once
/// Threads for blocking work (host memcpy, checksums) whose completions return to the loop:
/// the host's stand-in for a DMA copy engine.
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "runtime/event_loop.hpp"

namespace ferry {

/// Thread-safe.
class worker_pool {
 public:
  /// `threads` = 0 picks the hardware concurrency (at least 2).
  explicit worker_pool(unsigned threads = 0);
  ~worker_pool();

  /// Runs `work()` on a pool thread, then `done()` on `loop`.
  void async_run(event_loop& loop, std::function<void()> work, std::function<void()> done);
  /// Runs `work()` on a pool thread and suspends the calling fiber until it finished.
  void run(event_loop& loop, std::function<void()> work);

  /// Blocks the calling thread until no task is queued or running, and each one's `work` has been
  /// destroyed with what it captured (their `done` may still wait on their loops). For unwinding a
  /// job stopped mid-update: once nothing new can start (its transports closed), the copies already
  /// here land before the memory they touch is freed. Never call it from a pool thread.
  void wait_idle();

  unsigned threads() const { return threads_; }
  /// A process-wide pool for host copies.
  static worker_pool& shared();

 private:
  unsigned threads_;
  std::mutex idle_mutex_;
  std::condition_variable idle_;
  std::size_t tasks_ = 0;  ///< queued or running; guarded by `idle_mutex_`
  boost::asio::thread_pool pool_;
};

}  // namespace ferry
