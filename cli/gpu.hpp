#pragma once
/// The GPU side of `ferry node --device N`: the process's copy engine, device memory, NCCL
/// broadcast factory, device tensors, and the final byte check. Without CUDA in the build,
/// `open_gpu` says so and nothing else is reachable.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/rollout_worker.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/device_memory.hpp"

namespace ferry::cli {

/// One process's GPU. Owning loop only.
struct gpu_context {
  int device = -1;
  std::unique_ptr<device_memory> memory;
  std::unique_ptr<copy_engine> copies;
  broadcast_factory make_broadcast;
  /// `tensors` placed on the device, one allocation of each one's part, released with the context.
  std::vector<tensor_ref> allocate(std::vector<tensor_ref> tensors, std::string& why);
  ~gpu_context();

 private:
  std::vector<std::byte*> allocations_;
};

/// CUDA devices this process sees; 0 without CUDA in the build.
int visible_gpus();

/// Opens `device`; null with `why` when CUDA is absent from the build or the device unusable.
std::unique_ptr<gpu_context> open_gpu(event_loop& loop, int device, std::string& why);

/// Compares every byte of the device `tensors` with `fill_version(name, version)`; "" when all
/// match, else what differs. Blocks the calling thread (end of a job only); uses `threads` threads.
std::string check_device_tensors(const std::vector<tensor_ref>& tensors, std::uint64_t version,
                                 unsigned threads = 8);

/// Blocking copy between host and device memory (cudaMemcpy); for setup and checks.
std::error_code copy_blocking(void* dst, const void* src, std::size_t bytes);

/// Makes `device` current on the calling thread.
std::error_code select_device(int device);

}  // namespace ferry::cli
