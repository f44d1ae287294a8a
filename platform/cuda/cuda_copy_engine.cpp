#include "platform/cuda/cuda_copy_engine.hpp"

#include <cuda_runtime.h>

#include "platform/cuda/cuda_error.hpp"

namespace ferry {
namespace {

/// What the stream's host function needs: heap-allocated, owned by that function once launched.
struct copy_completion {
  event_loop* loop;
  copy_engine::completion done;
};

/// Runs on a CUDA-owned thread once the copies before it finished: hand over to the loop, and
/// nothing else (CUDA calls are forbidden here).
void CUDART_CB copies_finished(void* user) {
  auto* c = static_cast<copy_completion*>(user);
  c->loop->post([done = std::move(c->done)] { done({}); });
  delete c;
}

}  // namespace

result<std::unique_ptr<cuda_copy_engine>> cuda_copy_engine::make(event_loop& loop, int device) {
  if (auto ec = make_cuda_error(cudaSetDevice(device))) return fail(ec);
  cudaStream_t stream = nullptr;
  if (auto ec = make_cuda_error(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)))
    return fail(ec);
  return std::unique_ptr<cuda_copy_engine>(new cuda_copy_engine(loop, device, stream));
}

cuda_copy_engine::~cuda_copy_engine() {
  auto stream = static_cast<cudaStream_t>(stream_);
  // Copies still queued complete (their handlers are posted to the loop) before the stream goes.
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void cuda_copy_engine::async_copy(std::vector<copy_piece> pieces, completion done) {
  auto stream = static_cast<cudaStream_t>(stream_);
  auto failed = [&](cudaError_t status) {
    (void)cudaGetLastError();
    loop_.post([done = std::move(done), ec = make_cuda_error(status)] { done(ec); });
  };
  if (auto status = cudaSetDevice(device_); status != cudaSuccess) return failed(status);
  for (const auto& p : pieces) {
    if (p.bytes == 0) continue;
    if (auto status = cudaMemcpyAsync(p.dst, p.src, p.bytes, cudaMemcpyDefault, stream);
        status != cudaSuccess) {
      return failed(status);
    }
  }
  auto* c = new copy_completion{&loop_, std::move(done)};
  if (auto status = cudaLaunchHostFunc(stream, copies_finished, c); status != cudaSuccess) {
    done = std::move(c->done);
    delete c;
    return failed(status);
  }
}

}  // namespace ferry
