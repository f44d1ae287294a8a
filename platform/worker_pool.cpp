#include "platform/worker_pool.hpp"

#include <algorithm>
#include <thread>

#include "runtime/await.hpp"

namespace ferry {

namespace {
unsigned pick(unsigned threads) { return threads ? threads : std::max(2u, std::thread::hardware_concurrency()); }
}  // namespace

worker_pool::worker_pool(unsigned threads) : threads_(pick(threads)), pool_(threads_) {}
worker_pool::~worker_pool() { pool_.join(); }

void worker_pool::async_run(event_loop& loop, std::function<void()> work, std::function<void()> done) {
  boost::asio::post(pool_, [&loop, work = std::move(work), done = std::move(done)]() mutable {
    work();
    loop.post(std::move(done));
  });
}

void worker_pool::run(event_loop& loop, std::function<void()> work) {
  await<>([&](auto done) { async_run(loop, std::move(work), std::move(done)); });
}

worker_pool& worker_pool::shared() {
  static worker_pool pool;
  return pool;
}

}  // namespace ferry
