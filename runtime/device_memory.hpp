#pragma once
/// Where staging for the instance broadcast lives, how host buffers become DMA-able, and device
/// memory that processes of one host share (a trainer's device copies, read in place by leaders).
/// Hosts: plain host memory. GPUs: cudaMalloc on one device, cudaHostRegister for host buffers,
/// CUDA VMM for shared memory (platform/cuda/). Base header: no CUDA types.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/define_map.hpp"
#include "runtime/errc.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

/// Where a member's tensors live, as far as the plan's choice of path between two members needs.
struct device_place {
  std::uint64_t host = 0;  ///< `same_host_tag()` of the member's process (0: unknown)
  std::string gpu;         ///< its GPU's UUID; empty: host memory
  /// GPUs whose memory its GPU reads directly (peer access), its own included.
  std::vector<std::string> reads;
  /// Its transport reads and writes its GPU's memory (GPUDirect RDMA: a NIC's writes land there).
  bool rdma = false;
  friend bool operator==(const device_place&, const device_place&) = default;
  FERRY_DEFINE_MAP(host, gpu, reads, rdma)
};

/// Names device memory another process of the host may map, as shared host memory is named: the
/// owner's pid and the fd that exports it.
using shared_device_ref = shared_memory_ref;

/// Device memory shared by processes of one host: allocated and exported here, or another
/// process's mapped here. Destroying it unmaps it; the bytes live until no process holds them,
/// so a mapping stays readable after its owner died (it reads what the owner last wrote).
class shared_device_buffer {
 public:
  virtual ~shared_device_buffer() = default;
  virtual std::span<std::byte> bytes() const = 0;
  /// How another process maps it; `pid` 0 for a mapping of another process's buffer.
  virtual shared_device_ref ref() const = 0;
};

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
  /// Where memory of this device lives: its host and GPU, and the GPUs it reads directly.
  virtual device_place place() const { return {}; }
  /// `bytes` of this device's memory that another process of this host can map (`map_shared`);
  /// fails saying why (host memory has none).
  virtual result<std::unique_ptr<shared_device_buffer>> allocate_shared(std::size_t bytes,
                                                                        std::string& why);
  /// Maps `ref`, another process's shared device memory, for this device's copies; fails saying
  /// why (another host, the owner or its fd gone, no peer access between the two GPUs).
  virtual result<std::unique_ptr<shared_device_buffer>> map_shared(const shared_device_ref& ref,
                                                                   std::string& why);
};

}  // namespace ferry
