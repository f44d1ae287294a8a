#include "platform/worker_pool.hpp"

#include <algorithm>
#include <thread>

#include "runtime/await.hpp"

namespace ferry {

namespace {
unsigned pick(unsigned threads) {
  return threads ? threads : std::max(2u, std::thread::hardware_concurrency());
}
}  // namespace

worker_pool::worker_pool(unsigned threads) : threads_(pick(threads)), pool_(threads_) {}
worker_pool::~worker_pool() {
  pool_.join();
}

void worker_pool::async_run(event_loop& loop, std::function<void()> work,
                            std::function<void()> done) {
  {
    std::lock_guard lock(idle_mutex_);
    ++tasks_;
  }
  boost::asio::post(pool_, [this, &loop, work = std::move(work), done = std::move(done)]() mutable {
    work();
    // What the work holds goes before the pool reports idle: a waiter may then free what it points
    // at (an inproc transport's network, whose last holder this copy may be).
    work = nullptr;
    loop.post(std::move(done));
    std::lock_guard lock(idle_mutex_);
    if (--tasks_ == 0) idle_.notify_all();
  });
}

void worker_pool::wait_idle() {
  std::unique_lock lock(idle_mutex_);
  idle_.wait(lock, [this] { return tasks_ == 0; });
}

void worker_pool::run(event_loop& loop, std::function<void()> work) {
  await<>([&](auto done) { async_run(loop, std::move(work), std::move(done)); });
}

worker_pool& worker_pool::shared() {
  static worker_pool pool;
  return pool;
}

}  // namespace ferry
