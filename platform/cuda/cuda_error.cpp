#include "platform/cuda/cuda_error.hpp"

#include <cuda_runtime.h>

#include <string>

namespace ferry {
namespace {

class cuda_error_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int value) const override {
    return std::string(cudaGetErrorName(static_cast<cudaError_t>(value))) + ": " +
           cudaGetErrorString(static_cast<cudaError_t>(value));
  }
};

}  // namespace

const std::error_category& cuda_category() noexcept {
  static const cuda_error_category category;
  return category;
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

std::error_code cuda_copy_blocking(void* dst, const void* src, std::size_t bytes) noexcept {
  return make_cuda_error(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

std::error_code cuda_set_device(int device) noexcept {
  return make_cuda_error(cudaSetDevice(device));
}

}  // namespace ferry
