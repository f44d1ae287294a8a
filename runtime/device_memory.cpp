#include "runtime/device_memory.hpp"

namespace ferry {

result<std::unique_ptr<shared_device_buffer>> device_memory::allocate_shared(std::size_t,
                                                                             std::string& why) {
  why = "device " + std::to_string(device()) + " has no memory that other processes can map";
  return fail(errc::invalid_argument);
}

result<std::unique_ptr<shared_device_buffer>> device_memory::map_shared(
    const shared_device_ref& ref, std::string& why) {
  why = "device " + std::to_string(device()) + " cannot map the device memory of process " +
        std::to_string(ref.pid);
  return fail(errc::invalid_argument);
}

}  // namespace ferry
