#include "runtime/environment.hpp"

#include "runtime/await.hpp"

namespace ferry {

void executor::run(std::uint64_t bytes, std::function<void()> work) {
  await<>([&](auto done) { async_run(bytes, std::move(work), std::move(done)); });
}

}  // namespace ferry
