#include "runtime/copy_engine.hpp"

#include <cstring>

namespace ferry {

void host_copy_engine::async_copy(std::vector<copy_piece> pieces, completion done) {
  pool_.async_run(
      loop_,
      [pieces = std::move(pieces)] {
        for (const auto& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
      },
      [done = std::move(done)] { done({}); });
}

}  // namespace ferry
