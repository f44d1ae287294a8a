#include "runtime/environment.hpp"

#include "runtime/await.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

void executor::run(std::uint64_t bytes, std::function<void()> work) {
  await<>([&](auto done) { async_run(bytes, std::move(work), std::move(done)); });
}

host_buffer platform::host_memory(std::size_t bytes, bool shareable) {
  return shareable ? host_buffer::shareable(bytes) : host_buffer(bytes);
}

}  // namespace ferry
