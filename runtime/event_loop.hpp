#pragma once
/// One event loop per thread: an `asio::io_context` with Boost.Fiber scheduled on the same thread,
/// so actor code runs as straight-line fibers that wait on I/O without blocking the thread.
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <exception>
#include <functional>
#include <optional>
#include <system_error>

namespace ferry {

namespace asio = boost::asio;
class fiber_scheduler;

/// Thread rules: construct, run and spawn on one thread; `post` and `stop` are thread-safe.
/// Asio handlers run on the loop's main fiber and must never block on fiber primitives: they
/// complete promises, push to mailboxes, or spawn fibers.
class event_loop {
 public:
  /// Who may `post` to the loop: any thread (the default), or only the loop's own thread (a
  /// virtual-time job, where nothing else runs); Asio then takes no lock for the loop's handlers.
  enum class posters { any_thread, own_thread };

  /// Installs the fiber scheduler on the calling thread; no fiber may exist on it yet.
  explicit event_loop(posters who = posters::any_thread);
  ~event_loop();
  event_loop(const event_loop&) = delete;
  event_loop& operator=(const event_loop&) = delete;

  asio::io_context& io() { return io_; }
  asio::io_context::executor_type executor() { return io_.get_executor(); }

  /// Starts `fn` as a detached fiber. An exception escaping it stops the loop and is returned
  /// (or rethrown) by `run`.
  void spawn(std::function<void()> fn);

  /// Runs handlers and fibers until `stop()`; idles in epoll, never spins. Throws what a fiber
  /// threw.
  void run();
  /// Same, returning instead of throwing: the error of the first failed fiber, if any.
  std::error_code run(std::exception_ptr& failure);

  /// Runs until `done()` holds (checked after every handler batch and fiber turn) or stop().
  void run_until(const std::function<bool()>& done);

  /// Ends `run` after the current handler; thread-safe.
  void stop();
  /// Loop thread only: stops the loop as an exception escaping a fiber does; `run` returns (or
  /// rethrows) the first such failure.
  void fail(std::exception_ptr failure);

  /// Virtual time: when nothing is ready, the loop calls `idle()` instead of blocking; it makes
  /// something ready or runs it (jumps the clock to the next timers and fires them), or returns
  /// false, which stops the loop as `stalled()`: nothing can ever become ready again. What it
  /// posted runs in the same turn, before `run_until` checks again. Set before running.
  void on_idle(std::function<bool()> idle) { idle_ = std::move(idle); }
  bool stalled() const { return stalled_; }

  /// Queues `fn` to run on the loop; thread-safe unless made for `own_thread` posters. The way
  /// other threads hand results back.
  /// The destructor waits for posts still inside Asio, so a thread may post the completion that
  /// lets the owner destroy the loop (see `posting_`).
  template <class F>
  void post(F&& fn) {
    if (own_thread_only_) return asio::post(io_, std::forward<F>(fn));
    posting_.fetch_add(1, std::memory_order_relaxed);
    asio::post(io_, std::forward<F>(fn));
    posting_.fetch_sub(1, std::memory_order_release);
  }

 private:
  void turn(bool may_block);

  bool own_thread_only_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  fiber_scheduler* scheduler_ = nullptr;
  bool stopping_ = false;
  bool stalled_ = false;
  std::function<bool()> idle_;
  std::exception_ptr failure_;
  /// Calls of `post` not yet returned. Asio queues the handler, unlocks, and only then signals
  /// its condition variable: the loop may already run the handler (and its owner destroy the
  /// loop) while the posting thread is still in pthread_cond_signal on the io_context's memory.
  std::atomic<unsigned> posting_{0};
  friend class fiber_scheduler;
};

}  // namespace ferry
