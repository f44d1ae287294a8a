#pragma once
/// Device memory that processes of one host share, through CUDA's virtual memory management:
/// the owner creates it with a POSIX fd as its shareable handle; another process takes that fd
/// (pidfd_getfd, the same ptrace check as process_vm_readv), imports it and maps it for its own
/// GPU, which then copies from it over NVLink or PCIe (or inside one GPU). The driver counts
/// references to the physical memory: it is freed once the owner and every mapping let go, so a
/// mapping never reads freed memory, even after its owner died.
#include <memory>
#include <string>

#include "runtime/device_memory.hpp"

namespace ferry {

/// Whether `device` can share memory so: the driver has VMM and exports POSIX fds. Thread-safe.
bool cuda_can_share(int device);
/// `bytes` (rounded up to the allocation granularity) on `device`, readable and writable there,
/// exported for other processes. Thread-safe.
result<std::unique_ptr<shared_device_buffer>> cuda_allocate_shared(int device, std::size_t bytes,
                                                                   std::string& why);
/// Maps `ref` for reads and writes by `device`. Thread-safe.
result<std::unique_ptr<shared_device_buffer>> cuda_map_shared(int device,
                                                              const shared_device_ref& ref,
                                                              std::string& why);

}  // namespace ferry
