#pragma once
/// The copy engine of a GPU process: cudaMemcpyAsync (cudaMemcpyDefault, so host<->device and
/// device<->device alike) on one dedicated non-blocking stream per engine. Completions come back
/// to the event loop through a host function the stream runs after the copies; that function
/// only posts to the loop (it never calls CUDA), so no thread spins waiting on the GPU.
#include <memory>

#include "runtime/copy_engine.hpp"
#include "runtime/errc.hpp"
#include "runtime/event_loop.hpp"

namespace ferry {

/// Owning loop only (construct, copy and destroy there).
class cuda_copy_engine final : public copy_engine {
 public:
  /// An engine whose stream lives on `device`; the CUDA error when the stream cannot be made.
  static result<std::unique_ptr<cuda_copy_engine>> make(event_loop& loop, int device);
  ~cuda_copy_engine() override;

  /// Host memory among the pieces should be pinned (device_memory::pin): pageable memory makes
  /// CUDA stage the copy and block the loop. Completion: `void(std::error_code)` on the loop,
  /// once, after every piece landed; a CUDA error from any of them.
  void async_copy(std::vector<copy_piece> pieces, completion done) override;

  int device() const { return device_; }

 private:
  cuda_copy_engine(event_loop& loop, int device, void* stream)
      : loop_(loop), device_(device), stream_(stream) {}

  event_loop& loop_;
  int device_;
  void* stream_;  ///< cudaStream_t
};

}  // namespace ferry
