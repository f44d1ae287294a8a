#include "platform/cuda/cuda_device_memory.hpp"

#include <cuda_runtime.h>

#include "platform/cuda/cuda_error.hpp"

namespace ferry {

result<std::byte*> cuda_device_memory::allocate(std::size_t bytes) {
  if (bytes == 0) return fail(errc::invalid_argument);
  if (auto ec = make_cuda_error(cudaSetDevice(device_))) return fail(ec);
  void* p = nullptr;
  if (auto ec = make_cuda_error(cudaMalloc(&p, bytes))) {
    (void)cudaGetLastError();
    return fail(ec);
  }
  return static_cast<std::byte*>(p);
}

void cuda_device_memory::release(std::byte* p) {
  if (!p) return;
  cudaSetDevice(device_);
  cudaFree(p);
}

std::error_code cuda_device_memory::pin(std::span<std::byte> host) {
  if (host.empty()) return {};
  if (auto ec = make_cuda_error(cudaSetDevice(device_))) return ec;
  auto status = cudaHostRegister(host.data(), host.size(), cudaHostRegisterPortable);
  if (status == cudaErrorHostMemoryAlreadyRegistered) status = cudaSuccess;
  if (status != cudaSuccess) (void)cudaGetLastError();
  return make_cuda_error(status);
}

void cuda_device_memory::unpin(std::span<std::byte> host) {
  if (host.empty()) return;
  if (cudaHostUnregister(host.data()) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace ferry
