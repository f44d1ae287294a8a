#pragma once
/// Copies between tensors and staging buffers: offload (device -> host copy), upload
/// (slot -> device), apply (slot -> engine weights). On hosts it is memcpy on the environment's
/// executor; on GPUs cudaMemcpyAsync on a dedicated stream (platform/cuda).
#include <cstddef>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

#include "runtime/environment.hpp"

namespace ferry {

/// One contiguous copy; `dst` and `src` may be host or device pointers.
struct copy_piece {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
};

/// Owning loop only; completions run on the loop.
class copy_engine {
 public:
  using completion = std::function<void(std::error_code)>;
  virtual ~copy_engine() = default;
  /// Copies every piece; completion `void(std::error_code)` once, after all of them landed.
  virtual void async_copy(std::vector<copy_piece> pieces, completion done) = 0;
};

/// memcpy on an executor; a large copy runs as several works at once.
class host_copy_engine final : public copy_engine {
 public:
  explicit host_copy_engine(executor& cpu) : cpu_(cpu) {}
  void async_copy(std::vector<copy_piece> pieces, completion done) override;

 private:
  executor& cpu_;
};

}  // namespace ferry
