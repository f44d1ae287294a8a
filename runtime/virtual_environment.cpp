#include "runtime/virtual_environment.hpp"

#include "runtime/host_buffer.hpp"

namespace ferry {

virtual_environment::virtual_environment(event_loop& loop, cpu_cost_model cost)
    : loop_(loop), clock_(loop.io()), cpu_(clock_, cost), copies_(cpu_), platform_(loop) {
  loop_.on_idle([this] { return clock_.advance_to_next(); });
}

void virtual_environment::inline_executor::async_run(std::uint64_t bytes,
                                                     std::function<void()> work,
                                                     std::function<void()> done) {
  work();
  const auto cost =
      cost_.latency + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                          static_cast<double>(bytes) / cost_.bytes_per_second));
  clock_.async_wait(cost, [done = std::move(done)](std::error_code) { done(); });
}

result<host_buffer> virtual_environment::no_platform::map_shared(const shared_memory_ref&,
                                                                 std::string& why) {
  why = "shared host copies need real processes; a virtual-time job has none";
  return fail(errc::invalid_argument);
}

void virtual_environment::no_platform::async_blocking(std::function<std::error_code()>,
                                                      std::function<void(std::error_code)> done) {
  loop_.post([done = std::move(done)] { done(make_error_code(errc::invalid_argument)); });
}

}  // namespace ferry
