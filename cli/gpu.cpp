#include "cli/gpu.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "actors/synthetic_model.hpp"
#include "runtime/host_buffer.hpp"

#if FERRY_HAS_CUDA
#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#endif

namespace ferry::cli {

device_tensors::~device_tensors() {
  for (auto* p : allocations_) memory_->release(p);
}

#if FERRY_HAS_CUDA

int visible_gpus() {
  return cuda_device_count();
}

std::vector<tensor_ref> device_tensors::allocate(std::vector<tensor_ref> tensors,
                                                 std::string& why) {
  if (!memory_) memory_ = std::make_unique<cuda_device_memory>(device_);
  for (auto& t : tensors) {
    const auto bytes = t.held().bytes;
    auto p = memory_->allocate(bytes);
    if (!p) {
      why = "cannot allocate " + std::to_string(bytes) + " bytes for '" + t.spec.name +
            "' on GPU " + std::to_string(device_) + ": " + p.error().message();
      return {};
    }
    allocations_.push_back(*p);
    t.data = *p;
    t.device = device_;
  }
  return tensors;
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

std::vector<tensor_ref> device_tensors::allocate(std::vector<tensor_ref>, std::string& why) {
  why = "this ferry was built without CUDA (FERRY_CUDA=OFF or no CUDA/NCCL found)";
  return {};
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
