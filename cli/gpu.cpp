#include "cli/gpu.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "actors/synthetic_model.hpp"
#include "runtime/host_buffer.hpp"

#if FERRY_HAS_CUDA
#include "collectives/nccl/nccl_broadcast.hpp"
#include "platform/cuda/cuda_copy_engine.hpp"
#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#endif

namespace ferry::cli {

std::vector<tensor_ref> gpu_context::allocate(std::vector<tensor_ref> tensors, std::string& why) {
  for (auto& t : tensors) {
    const auto bytes = t.held().bytes;
    auto p = memory->allocate(bytes);
    if (!p) {
      why = "cannot allocate " + std::to_string(bytes) + " bytes for '" + t.spec.name + "' on GPU " +
            std::to_string(device) + ": " + p.error().message();
      return {};
    }
    allocations_.push_back(*p);
    t.data = *p;
    t.device = device;
  }
  return tensors;
}

gpu_context::~gpu_context() {
  copies.reset();
  for (auto* p : allocations_) memory->release(p);
}

#if FERRY_HAS_CUDA

int visible_gpus() {
  return cuda_device_count();
}

std::unique_ptr<gpu_context> open_gpu(event_loop& loop, int device, std::string& why) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    why = "--device " + std::to_string(device) + ": this host has " + std::to_string(count) +
          " CUDA devices";
    return nullptr;
  }
  auto ctx = std::make_unique<gpu_context>();
  ctx->device = device;
  ctx->memory = std::make_unique<cuda_device_memory>(device);
  auto copies = cuda_copy_engine::make(loop, device);
  if (!copies) {
    why = "cannot create the copy stream on GPU " + std::to_string(device) + ": " +
          copies.error().message();
    return nullptr;
  }
  ctx->copies = std::move(*copies);
  ctx->make_broadcast = nccl_broadcast_factory(device);
  return ctx;
}

std::error_code copy_blocking(void* dst, const void* src, std::size_t bytes) {
  return cuda_copy_blocking(dst, src, bytes);
}

std::error_code select_device(int device) {
  return cuda_set_device(device);
}

#else

int visible_gpus() {
  return 0;
}

std::unique_ptr<gpu_context> open_gpu(event_loop&, int, std::string& why) {
  why = "this ferry was built without CUDA (FERRY_CUDA=OFF or no CUDA/NCCL found)";
  return nullptr;
}

std::error_code copy_blocking(void*, const void*, std::size_t) {
  return errc::invalid_argument;
}

std::error_code select_device(int) {
  return errc::invalid_argument;
}

#endif

std::string check_device_tensors(const std::vector<tensor_ref>& tensors, std::uint64_t version,
                                 unsigned threads) {
  std::uint64_t largest = 0;
  for (const auto& t : tensors) largest = std::max(largest, t.spec.nbytes);
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::string error;
  auto work = [&] {
    // A thread's current device defaults to 0: select the tensors' own, or CUDA opens a context
    // there.
    if (!tensors.empty()) (void)select_device(tensors.front().device);
    host_buffer got(largest), want(largest);
    for (std::size_t i = next++; i < tensors.size(); i = next++) {
      const auto& t = tensors[i];
      const auto part = t.held();
      if (auto ec = copy_blocking(got.data(), t.data, part.bytes)) {
        std::lock_guard lock(mutex);
        error = "cannot read '" + t.spec.name + "' back: " + ec.message();
        return;
      }
      fill_version({want.data(), t.spec.nbytes}, t.spec.name, version);
      if (std::memcmp(got.data(), want.data() + part.offset, part.bytes) != 0) {
        std::lock_guard lock(mutex);
        error = "tensor '" + t.spec.name + "' differs from version " + std::to_string(version);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < std::max(1u, threads); ++i) pool.emplace_back(work);
  for (auto& th : pool) th.join();
  return error;
}

}  // namespace ferry::cli
