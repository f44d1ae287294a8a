#pragma once
/// Device memory of one GPU (cudaMalloc), page-locking of host buffers for its copies
/// (cudaHostRegister), so host buffers allocated once (host_buffer) become DMA targets, and device
/// memory shared with other processes of the host (cuda_shared_memory.hpp).
#include "runtime/device_memory.hpp"

namespace ferry {

/// Thread-safe (CUDA's allocator is); sets its device current on the calling thread.
class cuda_device_memory final : public device_memory {
 public:
  explicit cuda_device_memory(int device) : device_(device) {}

  int device() const override { return device_; }
  /// cudaMalloc on the device; `errc::invalid_argument` for 0 bytes, the CUDA error otherwise.
  result<std::byte*> allocate(std::size_t bytes) override;
  void release(std::byte* p) override;
  /// cudaHostRegister (portable): the buffer becomes pinned for every device of the process.
  std::error_code pin(std::span<std::byte> host) override;
  void unpin(std::span<std::byte> host) override;
  /// This host, the GPU's UUID, and every visible GPU it has peer access to.
  device_place place() const override;
  result<std::unique_ptr<shared_device_buffer>> allocate_shared(std::size_t bytes,
                                                                std::string& why) override;
  result<std::unique_ptr<shared_device_buffer>> map_shared(const shared_device_ref& ref,
                                                           std::string& why) override;

 private:
  int device_;
};

}  // namespace ferry
