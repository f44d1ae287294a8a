#include "runtime/copy_engine.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

namespace ferry {

void host_copy_engine::async_copy(std::vector<copy_piece> pieces, completion done) {
  // A large copy is cut into parts that run on several pool threads at once: one thread's
  // memcpy moves 10-15 GB/s, a host's memory several times that.
  constexpr std::size_t min_part = std::size_t{4} << 20;
  std::size_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  const std::size_t parts = std::clamp<std::size_t>(total / min_part, 1, cpu_.parallelism());
  const std::size_t per_part = (total + parts - 1) / parts;
  std::vector<std::vector<copy_piece>> groups(1);
  std::size_t in_group = 0;
  for (copy_piece p : pieces) {
    while (p.bytes > 0) {
      if (in_group >= per_part && groups.size() < parts) {
        groups.emplace_back();
        in_group = 0;
      }
      const std::size_t n =
          groups.size() < parts ? std::min(p.bytes, per_part - in_group) : p.bytes;
      groups.back().push_back({p.dst, p.src, n});
      p.dst += n;
      p.src += n;
      p.bytes -= n;
      in_group += n;
    }
  }
  auto left = std::make_shared<std::size_t>(groups.size());
  auto finish = std::make_shared<completion>(std::move(done));
  for (auto& group : groups) {
    std::uint64_t bytes = 0;
    for (const auto& p : group) bytes += p.bytes;
    cpu_.async_run(
        bytes,
        [group = std::move(group)] {
          for (const auto& p : group) std::memcpy(p.dst, p.src, p.bytes);
        },
        [left, finish] {
          if (--*left == 0) (*finish)({});
        });
  }
}

}  // namespace ferry
