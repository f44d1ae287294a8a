#pragma once
/// A member's GPU, when its tensors live on one: the CUDA copy engine of its loop's environment,
/// the device's memory services (pinning host copies, device slots), and the NCCL collective of
/// its instance. Without CUDA in the build, `open_member_gpu` says so and nothing else is made.
#include <memory>
#include <string>

#include "actors/rollout_worker.hpp"
#include "runtime/copy_engine.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/event_loop.hpp"

namespace ferry::api {

struct member_gpu {
  int device = -1;
  std::unique_ptr<device_memory> memory;
  std::unique_ptr<copy_engine> copies;
  broadcast_factory make_broadcast;
};

/// Opens `device` for a member whose loop is `loop`; null with `why` when CUDA is absent from the
/// build or the device is not there.
std::unique_ptr<member_gpu> open_member_gpu(event_loop& loop, int device, std::string& why);

}  // namespace ferry::api
