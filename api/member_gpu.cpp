#include "api/member_gpu.hpp"

#if FERRY_HAS_CUDA
#include "collectives/nccl/nccl_broadcast.hpp"
#include "platform/cuda/cuda_copy_engine.hpp"
#include "platform/cuda/cuda_device_memory.hpp"
#include "platform/cuda/cuda_error.hpp"
#endif

namespace ferry::api {

#if FERRY_HAS_CUDA

std::unique_ptr<member_gpu> open_member_gpu(event_loop& loop, int device, std::string& why) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    why = "device " + std::to_string(device) + ": this host has " + std::to_string(count) +
          " CUDA devices";
    return nullptr;
  }
  auto gpu = std::make_unique<member_gpu>();
  gpu->device = device;
  gpu->memory = std::make_unique<cuda_device_memory>(device);
  auto copies = cuda_copy_engine::make(loop, device);
  if (!copies) {
    why = "cannot create the copy stream on GPU " + std::to_string(device) + ": " +
          copies.error().message();
    return nullptr;
  }
  gpu->copies = std::move(*copies);
  gpu->make_broadcast = nccl_broadcast_factory(device);
  return gpu;
}

#else

std::unique_ptr<member_gpu> open_member_gpu(event_loop&, int device, std::string& why) {
  why = "device " + std::to_string(device) +
        ": this ferry was built without CUDA (FERRY_CUDA=OFF or no CUDA/NCCL found)";
  return nullptr;
}

#endif

}  // namespace ferry::api
