#include "sim/gpu_memory.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/host_buffer.hpp"

namespace ferry::sim {

std::byte* gpu_addresses::take_in(std::size_t range, std::size_t bytes) {
  constexpr std::uint64_t page = 4096, capacity = std::uint64_t{1} << range_bits;
  // A page apart from the next: a size-only range is never touched, but stays apart as real ones.
  const auto span = (std::uint64_t{bytes} + 2 * page - 1) / page * page;
  auto& used = used_[range];
  if (span > capacity - used) return nullptr;
  const auto at = device_base + (std::uint64_t{range} << range_bits) + used;
  used += span;
  return reinterpret_cast<std::byte*>(at);
}

std::string gpu_name(unsigned gpu) {
  return fmt::format("gpu{}", gpu);
}

namespace {

/// Shared device memory as its addresses: the owner's, or the same ones mapped by a peer.
class shared_range final : public shared_device_buffer {
 public:
  shared_range(std::span<std::byte> bytes, shared_device_ref ref) : bytes_(bytes), ref_(ref) {}
  std::span<std::byte> bytes() const override { return bytes_; }
  shared_device_ref ref() const override { return ref_; }

 private:
  std::span<std::byte> bytes_;
  shared_device_ref ref_;
};

}  // namespace

result<std::byte*> gpu_memory::allocate(std::size_t bytes) {
  if (auto* p = addresses_.take(gpu_, bytes)) return p;
  return fail(errc::invalid_argument);
}

result<std::unique_ptr<shared_device_buffer>> gpu_memory::allocate_shared(std::size_t bytes,
                                                                          std::string& why) {
  auto* p = addresses_.take(gpu_, bytes);
  if (!p) {
    why = fmt::format("{}'s simulated address range is full", place_.gpu);
    return fail(errc::invalid_argument);
  }
  // The simulation's one process: the pid its platform keeps alive, the GPU as the exporting fd,
  // the first address as the inode that tells one buffer from another.
  const shared_device_ref ref{.pid = host_buffer::simulated_pid,
                              .fd = static_cast<std::int32_t>(gpu_),
                              .inode = reinterpret_cast<std::uint64_t>(p),
                              .host = place_.host,
                              .bytes = bytes};
  return std::make_unique<shared_range>(std::span(p, bytes), ref);
}

result<std::unique_ptr<shared_device_buffer>> gpu_memory::map_shared(const shared_device_ref& ref,
                                                                     std::string& why) {
  auto* p = reinterpret_cast<std::byte*>(ref.inode);
  const auto owner = gpu_addresses::gpu_of(p);
  if (ref.host != place_.host) {
    why = fmt::format("process {} runs on another node", ref.pid);
  } else if (ref.pid != host_buffer::simulated_pid || !platform_.process_alive(ref.pid)) {
    why = fmt::format("process {} is gone", ref.pid);
  } else if (!gpu_addresses::on_device(p) || owner == gpu_addresses::anywhere) {
    why = fmt::format("{:#x} is no GPU's shared memory", ref.inode);
  } else if (std::ranges::find(place_.reads, gpu_name(owner)) == place_.reads.end()) {
    why = fmt::format("{} has no peer access to {}", place_.gpu, gpu_name(owner));
  } else {
    return std::make_unique<shared_range>(std::span(p, ref.bytes), shared_device_ref{});
  }
  return fail(errc::invalid_argument);
}

}  // namespace ferry::sim
