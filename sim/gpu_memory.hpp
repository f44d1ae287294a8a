#pragma once
/// Simulated GPU memory: sizes at addresses no one touches, each GPU's in a range of its own above
/// `gpu_addresses::device_base`, so that the GPU an address lies on is a shift away. The copy
/// model asks it of every device-to-device piece (hundreds of thousands per Kimi-K2 update), where
/// a search of the ~300k allocations such a run makes would cost a score of cache misses a piece.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"

namespace ferry::sim {

/// Every simulated GPU's address range. Owning loop only.
class gpu_addresses {
 public:
  /// Device memory lies above this address, host memory (host_buffer::size_only) below.
  static constexpr std::uintptr_t device_base = std::uintptr_t{3} << 62;
  /// Each range holds 2^46 bytes (64 TiB): hundreds of times what a run allocates on one GPU.
  static constexpr unsigned range_bits = 46;
  /// The GPUs the ranges hold; range 0 is `anywhere`'s.
  static constexpr unsigned max_gpus = (1u << (62 - range_bits)) - 1;
  /// Where memory lies that stands for each reader's own GPU (`take_anywhere`).
  static constexpr unsigned anywhere = ~0u;

  explicit gpu_addresses(unsigned gpus) : used_(std::size_t{gpus} + 1, 0) {}
  /// `bytes` on GPU `gpu`; null once its range is full.
  std::byte* take(unsigned gpu, std::size_t bytes) { return take_in(std::size_t{gpu} + 1, bytes); }
  /// `bytes` that stand for memory on whichever GPU copies them: one table of weights that every
  /// worker of a share holds as its own GPU's (a whole-model Kimi-K2 table is 25 MB, per worker).
  std::byte* take_anywhere(std::size_t bytes) { return take_in(0, bytes); }

  /// The range `p` lies in, as a number: one for all the addresses of a GPU (or of `anywhere`),
  /// at least `anywhere_range` for device memory.
  static std::uint64_t range_of(const void* p) { return address(p) >> range_bits; }
  static constexpr std::uint64_t anywhere_range = device_base >> range_bits;
  /// A number no address's range is.
  static constexpr std::uint64_t no_range = ~std::uint64_t{0};
  static constexpr std::uint64_t range_of_gpu(unsigned gpu) { return anywhere_range + 1 + gpu; }
  /// The GPU of a device range, or `anywhere`.
  static constexpr unsigned gpu_of_range(std::uint64_t range) {
    return static_cast<unsigned>(range - anywhere_range) - 1;
  }

  static bool on_device(const void* p) { return address(p) >= device_base; }
  /// The GPU device memory `p` lies on, or `anywhere`.
  static unsigned gpu_of(const void* p) { return gpu_of_range(range_of(p)); }

 private:
  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  std::byte* take_in(std::size_t range, std::size_t bytes);

  std::vector<std::uint64_t> used_;  ///< per range, the bytes handed out
};

/// A GPU's name in the cluster, as a `device_place` says it ("gpu12").
std::string gpu_name(unsigned gpu);

/// One simulated GPU as a member's device memory. Pinning is free. Shared memory (a trainer's
/// device copies) is named by its first address; a member of the same node whose GPU reads the
/// owner's maps it as those same addresses: one process, where an address names its GPU.
/// Owning loop only.
class gpu_memory final : public device_memory {
 public:
  /// GPU `gpu`, placed at `place` (its node as host, and the GPUs it reads); `platform` says
  /// whether a shared buffer's process lives.
  gpu_memory(gpu_addresses& addresses, ferry::platform& platform, unsigned gpu, device_place place)
      : addresses_(addresses), platform_(platform), gpu_(gpu), place_(std::move(place)) {}

  int device() const override { return static_cast<int>(gpu_); }
  result<std::byte*> allocate(std::size_t bytes) override;
  void release(std::byte*) override {}
  std::error_code pin(std::span<std::byte>) override { return {}; }
  void unpin(std::span<std::byte>) override {}
  device_place place() const override { return place_; }
  result<std::unique_ptr<shared_device_buffer>> allocate_shared(std::size_t bytes,
                                                                std::string& why) override;
  /// Refused, saying why, for another node's memory, a process gone, or a GPU this one does not
  /// read (`hardware.peer_access = false`).
  result<std::unique_ptr<shared_device_buffer>> map_shared(const shared_device_ref& ref,
                                                           std::string& why) override;

 private:
  gpu_addresses& addresses_;
  ferry::platform& platform_;
  unsigned gpu_;
  device_place place_;
};

}  // namespace ferry::sim
