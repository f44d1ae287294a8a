#pragma once
/// The GPU side of `ferry node --device N`, as a program that embeds ferry has it: device memory
/// for its tensors, blocking copies, and the final byte check (ferry's own GPU services are the
/// API's, `api/member_gpu.hpp`). Without CUDA in the build, nothing here reaches a device.
#include <memory>
#include <string>
#include <vector>

#include "actors/tensor.hpp"
#include "runtime/device_memory.hpp"

namespace ferry::cli {

/// A node's tensors on a GPU, one allocation of each one's part, freed with this.
class device_tensors {
 public:
  explicit device_tensors(int device) : device_(device) {}
  ~device_tensors();
  device_tensors(const device_tensors&) = delete;
  device_tensors& operator=(const device_tensors&) = delete;
  /// `tensors` placed on the device; empty with `why` when one cannot be.
  std::vector<tensor_ref> allocate(std::vector<tensor_ref> tensors, std::string& why);

 private:
  int device_;
  std::unique_ptr<device_memory> memory_;
  std::vector<std::byte*> allocations_;
};

/// CUDA devices this process sees; 0 without CUDA in the build.
int visible_gpus();

/// Compares every byte of the device `tensors` with `fill_version(name, version)`; "" when all
/// match, else what differs. Blocks the calling thread (end of a job only); uses `threads` threads.
std::string check_device_tensors(const std::vector<tensor_ref>& tensors, std::uint64_t version,
                                 unsigned threads = 8);

/// Blocking copy between host and device memory (cudaMemcpy); for setup and checks.
std::error_code copy_blocking(void* dst, const void* src, std::size_t bytes);

/// Makes `device` current on the calling thread.
std::error_code select_device(int device);

}  // namespace ferry::cli
