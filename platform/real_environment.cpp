#include "platform/real_environment.hpp"

#include <signal.h>

#include <cerrno>

#include "platform/available_memory.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

real_environment::real_environment(event_loop& loop, copy_engine* device_copies, worker_pool& pool)
    : loop_(loop),
      clock_(loop.io()),
      cpu_(loop, pool),
      host_copies_(cpu_),
      device_copies_(device_copies),
      platform_(loop) {}

real_environment::os_platform::~os_platform() {
  for (auto& [id, t] : blocking_) t.join();
}

bool real_environment::os_platform::process_alive(std::int32_t pid) {
  return kill(pid, 0) == 0 || errno != ESRCH;
}

result<host_buffer> real_environment::os_platform::map_shared(const shared_memory_ref& ref,
                                                              std::string& why) {
  return host_buffer::map_shared(ref, why);
}

std::optional<std::uint64_t> real_environment::os_platform::available_host_memory() {
  return ferry::available_host_memory();
}

void real_environment::os_platform::async_blocking(std::function<std::error_code()> work,
                                                   std::function<void(std::error_code)> done) {
  const auto id = next_id_++;
  blocking_.emplace(
      id, std::thread([this, id, work = std::move(work), done = std::move(done)]() mutable {
        const auto ec = work();
        loop_.post([this, id, ec, done = std::move(done)] {
          // The thread posted this as its last act: joining it is immediate.
          if (auto it = blocking_.find(id); it != blocking_.end()) {
            it->second.join();
            blocking_.erase(it);
          }
          done(ec);
        });
      }));
}

}  // namespace ferry
