#pragma once
/// CUDA runtime errors as std::error_code: the value is the cudaError_t, the message CUDA's own.
/// Plain C++: no CUDA types, so any file may include it.
#include <cstddef>
#include <system_error>

namespace ferry {

const std::error_category& cuda_category() noexcept;
/// `status` is a cudaError_t; 0 (cudaSuccess) gives an empty error_code.
inline std::error_code make_cuda_error(int status) noexcept {
  return status == 0 ? std::error_code{} : std::error_code{status, cuda_category()};
}

/// How many CUDA devices this process sees; 0 when there is no driver or no device.
/// Thread-safe.
int cuda_device_count() noexcept;

/// Copies `bytes` between any two host or device pointers and waits for it (cudaMemcpy with
/// cudaMemcpyDefault). For setup and checks, never on the loop during an update. Thread-safe.
std::error_code cuda_copy_blocking(void* dst, const void* src, std::size_t bytes) noexcept;

/// Makes `device` current on the calling thread.
std::error_code cuda_set_device(int device) noexcept;

}  // namespace ferry
