#pragma once
/// Copies between tensors and staging buffers: offload (device -> host copy), upload
/// (slot -> device), apply (slot -> engine weights). On hosts it is memcpy on worker threads;
/// on GPUs cudaMemcpyAsync on a dedicated stream with the completion delivered to the loop.
#include <cstddef>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

#include "runtime/event_loop.hpp"
#include "runtime/worker_pool.hpp"

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

/// memcpy on a worker pool; a large copy runs on several of its threads at once.
class host_copy_engine final : public copy_engine {
 public:
  explicit host_copy_engine(event_loop& loop, worker_pool& pool = worker_pool::shared()) : loop_(loop), pool_(pool) {}
  void async_copy(std::vector<copy_piece> pieces, completion done) override;

 private:
  event_loop& loop_;
  worker_pool& pool_;
};

}  // namespace ferry
