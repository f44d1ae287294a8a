#include "runtime/event_loop.hpp"

#include <sys/mman.h>

#include <boost/asio/post.hpp>
#include <boost/fiber/algo/algorithm.hpp>
#include <boost/fiber/all.hpp>
#include <boost/fiber/scheduler.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/log.hpp"

namespace ferry {

namespace {

/// Fiber stacks mapped from the kernel rather than taken from the heap: a page costs memory only
/// once the fiber touches it. A simulated cluster runs tens of thousands of mostly idle fibers (one
/// per trainer-to-worker route). Adjacent mappings of one kind merge, so they add few kernel maps.
/// The stacks of ended fibers are kept for the next ones: selective delivery at 384 GPUs starts
/// 66,000 fibers per version, and mapping, zeroing and unmapping each stack was half of its wall
/// time. A thread so keeps as many stacks as it had fibers at once, no more than it had then.
class mapped_stack {
 public:
  static constexpr std::size_t size = 256 * 1024;

  boost::context::stack_context allocate() {
    void* p = nullptr;
    if (!spares_gone && !spare().stacks.empty()) {
      p = spare().stacks.back();
      spare().stacks.pop_back();
    } else {
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    boost::context::stack_context stack;
    stack.size = size;
    stack.sp = static_cast<char*>(p) + size;
    return stack;
  }
  void deallocate(boost::context::stack_context& stack) noexcept {
    void* p = static_cast<char*>(stack.sp) - stack.size;
    if (!spares_gone) {
      try {
        spare().stacks.push_back(p);
        return;
      } catch (const std::bad_alloc&) {
      }
    }
    munmap(p, size);
  }

 private:
  struct spare_stacks {
    ~spare_stacks() {
      spares_gone = true;  // stacks that Boost releases later, as the thread ends, are unmapped
      for (void* p : stacks) munmap(p, size);
    }
    std::vector<void*> stacks;
  };
  static spare_stacks& spare() {
    thread_local spare_stacks s;
    return s;
  }
  static inline thread_local bool spares_gone = false;
};

}  // namespace

/// Round-robin fiber algorithm that tells the loop whether fibers are ready. The loop's main
/// fiber drives Asio; it blocks the thread in `run_one` only when no other fiber is ready, so
/// the thread idles in epoll instead of spinning.
class fiber_scheduler final : public boost::fibers::algo::algorithm {
 public:
  explicit fiber_scheduler(event_loop* loop) { loop->scheduler_ = this; }

  void awakened(boost::fibers::context* ctx) noexcept override {
    ready_.push_back(*ctx);
    if (!is_dispatcher(ctx)) ++ready_workers_;
  }
  boost::fibers::context* pick_next() noexcept override {
    if (ready_.empty()) return nullptr;
    auto* ctx = &ready_.front();
    ready_.pop_front();
    if (!is_dispatcher(ctx)) --ready_workers_;
    return ctx;
  }
  bool has_ready_fibers() const noexcept override { return !ready_.empty(); }
  /// Fibers other than Boost's dispatcher, which sits in the ready queue whenever it is idle.
  bool has_ready_workers() const noexcept { return ready_workers_ > 0; }

  // Reached only if every fiber, the loop's main fiber included, waits on a fiber primitive:
  // a handler broke the "never block" rule, or a fiber is woken from another thread.
  void suspend_until(const std::chrono::steady_clock::time_point& until) noexcept override {
    std::unique_lock lock(mutex_);
    if (until == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock, [this] { return notified_; });
    } else {
      cv_.wait_until(lock, until, [this] { return notified_; });
    }
    notified_ = false;
  }
  void notify() noexcept override {
    {
      std::lock_guard lock(mutex_);
      notified_ = true;
    }
    cv_.notify_all();
  }

 private:
  static bool is_dispatcher(boost::fibers::context* ctx) noexcept {
    return ctx->is_context(boost::fibers::type::dispatcher_context);
  }

  boost::fibers::scheduler::ready_queue_type ready_;
  std::size_t ready_workers_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool notified_ = false;
};

event_loop::event_loop(posters who)
    : own_thread_only_(who == posters::own_thread),
      io_(own_thread_only_ ? BOOST_ASIO_CONCURRENCY_HINT_UNSAFE
                           : BOOST_ASIO_CONCURRENCY_HINT_DEFAULT) {
  work_.emplace(io_.get_executor());
  boost::fibers::use_scheduling_algorithm<fiber_scheduler>(this);
}

event_loop::~event_loop() {
  work_.reset();
  // Let fibers that wait on completions see them fail rather than outlive their state.
  io_.stop();
  // A thread whose handler already ran may still be signalling the io_context (see `posting_`).
  while (posting_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void event_loop::spawn(std::function<void()> fn) {
  boost::fibers::fiber(std::allocator_arg, mapped_stack{}, [this, fn = std::move(fn)] {
    try {
      fn();
    } catch (...) {
      fail(std::current_exception());
    }
  }).detach();
}

void event_loop::turn(bool may_block) {
  // Every branch returns to the caller, which re-checks its condition before blocking again.
  if (io_.poll() > 0) return;
  if (scheduler_->has_ready_workers()) {
    boost::this_fiber::yield();
  } else if (may_block && !stopping_) {
    if (!idle_) {
      io_.run_one();
    } else if (!idle_()) {
      stalled_ = stopping_ = true;
    } else {
      io_.poll();
    }
  }
}

void event_loop::run_until(const std::function<bool()>& done) {
  if (io_.stopped()) io_.restart();
  stalled_ = false;
  stopping_ = false;
  while (!stopping_ && !done()) turn(true);
}

std::error_code event_loop::run(std::exception_ptr& failure) {
  run_until([] { return false; });
  failure = failure_;
  return failure_ ? make_error_code(errc::stopped) : std::error_code{};
}

void event_loop::run() {
  std::exception_ptr failure;
  run(failure);
  if (failure) std::rethrow_exception(failure);
}

void event_loop::stop() {
  post([this] { stopping_ = true; });
}

void event_loop::fail(std::exception_ptr failure) {
  if (!failure_) failure_ = std::move(failure);
  stop();
}

}  // namespace ferry
