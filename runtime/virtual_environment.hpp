#pragma once
/// Virtual time for a whole job in one thread: the loop jumps the clock to the next timer when
/// nothing is ready, CPU work and copies run inline and complete after a modelled cost, and
/// nothing touches the OS. One thread, no sleeps: the same inputs give the same run, event for
/// event (the trace's digest says so).
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>

#include "runtime/clock.hpp"
#include "runtime/codec.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/environment.hpp"
#include "runtime/event_loop.hpp"
#include "runtime/trace.hpp"

namespace ferry {

/// What CPU work costs on virtual time: `latency + bytes / bytes_per_second`.
struct cpu_cost_model {
  double bytes_per_second = 10e9;
  clock::duration latency = std::chrono::microseconds(2);
  unsigned parallelism = 4;
};

/// Owning loop only.
class virtual_environment final : public environment {
 public:
  /// Takes over `loop`'s idle turns; the loop must not have run yet.
  explicit virtual_environment(event_loop& loop, cpu_cost_model cost = {});

  event_loop& loop() override { return loop_; }
  virtual_clock& clock() override { return clock_; }
  executor& cpu() override { return cpu_; }
  copy_engine& copies() override { return copies_; }
  class platform& platform() override {
    return platform_;
  }
  class trace& trace() override {
    return trace_;
  }
  bool is_virtual() const override { return true; }
  /// Process `pid` is gone from now on (`platform().process_alive` says so): a virtual run's
  /// stand-in for a killed process whose resources (shared memory) other members named.
  void end_process(std::int32_t pid) { platform_.ended.insert(pid); }
  /// What `platform().available_host_memory` says from now on (nothing: unknown).
  void limit_host_memory(std::optional<std::uint64_t> bytes) { platform_.available = bytes; }

 private:
  class inline_executor final : public executor {
   public:
    inline_executor(virtual_clock& clock, cpu_cost_model cost) : clock_(clock), cost_(cost) {}
    void async_run(std::uint64_t bytes, std::function<void()> work,
                   std::function<void()> done) override;
    unsigned parallelism() const override { return cost_.parallelism; }

   private:
    virtual_clock& clock_;
    cpu_cost_model cost_;
  };
  /// No processes but those ended, no shared memory, no blocking calls.
  class no_platform final : public ferry::platform {
   public:
    explicit no_platform(event_loop& loop) : loop_(loop) {}
    bool process_alive(std::int32_t pid) override { return !ended.contains(pid); }
    result<host_buffer> map_shared(const shared_memory_ref&, std::string& why) override;
    /// Refused: a virtual run must not block on a real resource.
    void async_blocking(std::function<std::error_code()>,
                        std::function<void(std::error_code)> done) override;
    std::optional<std::uint64_t> available_host_memory() override { return available; }

    std::set<std::int32_t> ended;
    std::optional<std::uint64_t> available;

   private:
    event_loop& loop_;
  };

  event_loop& loop_;
  virtual_clock clock_;
  inline_executor cpu_;
  host_copy_engine copies_;
  no_platform platform_;
  class trace trace_;
};

}  // namespace ferry
