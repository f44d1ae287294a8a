#include "platform/cuda/cuda_shared_memory.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/same_host.hpp"

namespace ferry {
namespace {

/// The driver's VMM calls, found through the runtime (cudaGetDriverEntryPointByVersion), so that
/// nothing links libcuda: hosts without a driver still load ferry.
struct vmm_calls {
  decltype(&cuGetErrorName) error_name = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  std::string missing;  ///< the first call the driver lacks
};

const vmm_calls& vmm() {
  static const vmm_calls calls = [] {
    vmm_calls c;
    auto find = [&](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess || !p) {
        (void)cudaGetLastError();
        if (c.missing.empty()) c.missing = name;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    find("cuGetErrorName", c.error_name);
    find("cuDeviceGetAttribute", c.attribute);
    find("cuMemGetAllocationGranularity", c.granularity);
    find("cuMemCreate", c.create);
    find("cuMemRelease", c.release);
    find("cuMemAddressReserve", c.reserve);
    find("cuMemAddressFree", c.address_free);
    find("cuMemMap", c.map);
    find("cuMemUnmap", c.unmap);
    find("cuMemSetAccess", c.set_access);
    find("cuMemExportToShareableHandle", c.export_handle);
    find("cuMemImportFromShareableHandle", c.import_handle);
    return c;
  }();
  return calls;
}

/// "what: CUDA_ERROR_NAME" into `why`; false when `status` is an error.
bool ok(CUresult status, const char* what, std::string& why) {
  if (status == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  if (vmm().error_name) vmm().error_name(status, &name);
  why = std::string(what) + ": " + (name ? name : "CUresult " + std::to_string(status));
  return false;
}

/// The device current on this thread with its primary context made, which the driver calls need.
bool enter_device(int device, std::string& why) {
  if (!vmm().missing.empty()) {
    why = "the CUDA driver lacks " + vmm().missing + " (virtual memory management)";
    return false;
  }
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    why = "cannot use CUDA device " + std::to_string(device) + ": " +
          cudaGetErrorString(cudaGetLastError());
    return false;
  }
  return true;
}

/// Physical memory mapped at a reserved address range of this process, readable and writable by
/// one device; unmapped and its range freed on destruction. An owner also keeps the allocation
/// and the fd that exports it.
class vmm_buffer final : public shared_device_buffer {
 public:
  explicit vmm_buffer(std::size_t bytes) : bytes_(bytes) {}
  ~vmm_buffer() override {
    if (mapped_) vmm().unmap(address_, bytes_);
    if (address_) vmm().address_free(address_, bytes_);
    if (allocation_) vmm().release(allocation_);
    if (ref_.fd >= 0) close(ref_.fd);
  }
  std::span<std::byte> bytes() const override {
    return {reinterpret_cast<std::byte*>(address_), bytes_};
  }
  shared_device_ref ref() const override { return ref_; }

  /// Maps `allocation` at a fresh address range for `device`'s reads and writes.
  bool map_for(CUmemGenericAllocationHandle allocation, int device, std::string& why) {
    if (!ok(vmm().reserve(&address_, bytes_, 0, 0, 0), "cuMemAddressReserve", why)) return false;
    if (!ok(vmm().map(address_, bytes_, 0, allocation, 0), "cuMemMap", why)) return false;
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return ok(vmm().set_access(address_, bytes_, &access, 1),
              "cuMemSetAccess (peer access between the two GPUs)", why);
  }

  CUmemGenericAllocationHandle allocation_ = 0;  ///< the owner's; 0 in a mapping
  shared_device_ref ref_;

 private:
  std::size_t bytes_;
  CUdeviceptr address_ = 0;
  bool mapped_ = false;
};

std::uint64_t inode_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/// A copy of `pid`'s file descriptor `fd` in this process, or -1 saying why.
int take_fd(std::int32_t pid, std::int32_t fd, std::string& why) {
  const int process = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (process < 0) {
    why = "process " + std::to_string(pid) + " is gone (" + std::strerror(errno) + ")";
    return -1;
  }
  const int local = static_cast<int>(syscall(SYS_pidfd_getfd, process, fd, 0));
  const int error = errno;
  close(process);
  if (local < 0)
    why = "cannot take fd " + std::to_string(fd) + " of process " + std::to_string(pid) + ": " +
          std::strerror(error);
  return local;
}

}  // namespace

bool cuda_can_share(int device) {
  std::string why;
  int posix_fds = 0;
  return enter_device(device, why) &&
         vmm().attribute(&posix_fds,
                         CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                         device) == CUDA_SUCCESS &&
         posix_fds != 0;
}

result<std::unique_ptr<shared_device_buffer>> cuda_allocate_shared(int device, std::size_t bytes,
                                                                   std::string& why) {
  if (bytes == 0) {
    why = "no bytes to share";
    return fail(errc::invalid_argument);
  }
  if (!enter_device(device, why)) return fail(errc::invalid_argument);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t grain = 0;
  if (!ok(vmm().granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity", why))
    return fail(errc::invalid_argument);
  auto buffer = std::make_unique<vmm_buffer>((bytes + grain - 1) / grain * grain);
  const auto size = buffer->bytes().size();
  int fd = -1;
  if (!ok(vmm().create(&buffer->allocation_, size, &prop, 0), "cuMemCreate", why) ||
      !buffer->map_for(buffer->allocation_, device, why) ||
      !ok(vmm().export_handle(&fd, buffer->allocation_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                              0),
          "cuMemExportToShareableHandle", why)) {
    return fail(errc::invalid_argument);
  }
  static const std::uint64_t host = same_host_tag();
  buffer->ref_ = {.pid = static_cast<std::int32_t>(getpid()),
                  .fd = fd,
                  .inode = inode_of(fd),
                  .host = host,
                  .bytes = size};
  return buffer;
}

result<std::unique_ptr<shared_device_buffer>> cuda_map_shared(int device,
                                                              const shared_device_ref& ref,
                                                              std::string& why) {
  if (ref.host != same_host_tag()) {
    why = "process " + std::to_string(ref.pid) +
          " runs on another host, or in another pid or network namespace";
    return fail(errc::invalid_argument);
  }
  if (!enter_device(device, why)) return fail(errc::invalid_argument);
  const int fd = take_fd(ref.pid, ref.fd, why);
  if (fd < 0) return fail(errc::invalid_argument);
  if (inode_of(fd) != ref.inode) {
    close(fd);
    why = "fd " + std::to_string(ref.fd) + " of process " + std::to_string(ref.pid) +
          " is no longer its device memory";
    return fail(errc::invalid_argument);
  }
  CUmemGenericAllocationHandle allocation = 0;
  const bool imported =
      ok(vmm().import_handle(&allocation, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
         "cuMemImportFromShareableHandle", why);
  close(fd);  // the imported allocation holds the memory now
  if (!imported) return fail(errc::invalid_argument);
  auto buffer = std::make_unique<vmm_buffer>(ref.bytes);
  const bool mapped = buffer->map_for(allocation, device, why);
  vmm().release(allocation);  // the mapping holds it
  if (!mapped) return fail(errc::invalid_argument);
  return buffer;
}

}  // namespace ferry
