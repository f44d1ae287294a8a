#pragma once
/// Where staging for the instance broadcast lives, and how host buffers become DMA-able.
/// Hosts: plain host memory. GPUs: cudaMalloc on one device, cudaHostRegister for host buffers
/// (platform/cuda/). Base header: no CUDA types.
#include <cstddef>
#include <span>

#include "runtime/errc.hpp"

namespace ferry {

/// Owning loop only, unless an implementation says otherwise.
class device_memory {
 public:
  virtual ~device_memory() = default;
  /// The device index, or -1 for host memory.
  virtual int device() const = 0;
  /// `bytes` of memory on this device (not zeroed); `errc::invalid_argument` when it cannot.
  virtual result<std::byte*> allocate(std::size_t bytes) = 0;
  virtual void release(std::byte* p) = 0;
  /// Makes host memory fast for this device's copies (page-locks it); a no-op on hosts.
  virtual std::error_code pin(std::span<std::byte> host) = 0;
  virtual void unpin(std::span<std::byte> host) = 0;
};

}  // namespace ferry
