#include "platform/cuda/cuda_device_memory.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "platform/cuda/cuda_error.hpp"
#include "platform/cuda/cuda_shared_memory.hpp"
#include "runtime/same_host.hpp"

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

namespace {

/// The UUID of `device` as the driver prints it ("GPU-" and 32 hex digits); empty if unknown.
std::string uuid_of(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::string id = "GPU-";
  for (int i = 0; i < 16; ++i)
    id += fmt::format("{:02x}", static_cast<unsigned char>(prop.uuid.bytes[i]));
  return id;
}

}  // namespace

device_place cuda_device_memory::place() const {
  // A GPU that cannot share its memory with another process is only ever reached through host
  // memory.
  if (!cuda_can_share(device_)) return {};
  device_place p{.host = same_host_tag(), .gpu = uuid_of(device_)};
  if (p.gpu.empty()) return {};
  for (int other = 0, count = cuda_device_count(); other < count; ++other) {
    int can = other == device_;
    if (!can && cudaDeviceCanAccessPeer(&can, device_, other) != cudaSuccess)
      (void)cudaGetLastError();
    if (can) p.reads.push_back(uuid_of(other));
  }
  return p;
}

result<std::unique_ptr<shared_device_buffer>> cuda_device_memory::allocate_shared(
    std::size_t bytes, std::string& why) {
  return cuda_allocate_shared(device_, bytes, why);
}

result<std::unique_ptr<shared_device_buffer>> cuda_device_memory::map_shared(
    const shared_device_ref& ref, std::string& why) {
  return cuda_map_shared(device_, ref, why);
}

}  // namespace ferry
