#pragma once
/// The environment of real runs: wall time, a thread pool for CPU work, memcpy or a device's
/// copy engine, and the operating system.
#include <map>
#include <thread>

#include "platform/worker_pool.hpp"
#include "runtime/clock.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/environment.hpp"
#include "runtime/trace.hpp"

namespace ferry {

/// Owning loop only.
class real_environment final : public environment {
 public:
  /// `device_copies`: a device's copy engine (platform/cuda); null: memcpy on `pool`.
  explicit real_environment(event_loop& loop, copy_engine* device_copies = nullptr,
                            worker_pool& pool = worker_pool::shared());

  event_loop& loop() override { return loop_; }
  real_clock& clock() override { return clock_; }
  executor& cpu() override { return cpu_; }
  copy_engine& copies() override { return device_copies_ ? *device_copies_ : host_copies_; }
  class platform& platform() override {
    return platform_;
  }
  class trace& trace() override {
    return trace_;
  }
  bool is_virtual() const override { return false; }
  /// Blocks until the pool runs none of this environment's CPU work or host copies: a job that
  /// unwinds mid-update lets them land before it frees what they touch.
  void wait_idle() { cpu_.wait_idle(); }

 private:
  class pool_executor final : public executor {
   public:
    pool_executor(event_loop& loop, worker_pool& pool) : loop_(loop), pool_(pool) {}
    void async_run(std::uint64_t, std::function<void()> work, std::function<void()> done) override {
      pool_.async_run(loop_, std::move(work), std::move(done));
    }
    unsigned parallelism() const override { return pool_.threads(); }
    void wait_idle() { pool_.wait_idle(); }

   private:
    event_loop& loop_;
    worker_pool& pool_;
  };
  class os_platform final : public ferry::platform {
   public:
    explicit os_platform(event_loop& loop) : loop_(loop) {}
    ~os_platform() override;
    bool process_alive(std::int32_t pid) override;
    result<host_buffer> map_shared(const shared_memory_ref& ref, std::string& why) override;
    std::optional<std::uint64_t> available_host_memory() override;
    void async_blocking(std::function<std::error_code()> work,
                        std::function<void(std::error_code)> done) override;

   private:
    event_loop& loop_;
    std::uint64_t next_id_ = 0;
    std::map<std::uint64_t, std::thread> blocking_;  ///< joined once their completion ran
  };

  event_loop& loop_;
  real_clock clock_;
  pool_executor cpu_;
  host_copy_engine host_copies_;
  copy_engine* device_copies_;
  os_platform platform_;
  class trace trace_;
};

}  // namespace ferry
