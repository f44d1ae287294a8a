#pragma once
/// A rollout worker's staging memory. Receive slots (a leader's `depth` per trainer shard, then
/// the direct slots it grants chunk by chunk; a host follower's broadcast slots in their place)
/// are registered with the transport: in host memory, pinned for the worker's GPU, or on the GPU
/// itself where the transport reaches GPU memory (GPUDirect RDMA), so that no upload follows a
/// write. A worker on a GPU also has `depth` broadcast slots there. Staging is kept across epochs
/// while it fits; a kept region gets a new key, so that an older epoch's write still on its way
/// (held up by a cut link) cannot land over this epoch's. The writes the old key let in still
/// land: the staging is `settled` once they have.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/member_memory.hpp"
#include "collectives/broadcast.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// Owning loop only.
class worker_staging {
 public:
  /// `memory`: the worker's GPU, or null. `on_settled` runs on the loop when a kept region's
  /// older writes have all ended.
  worker_staging(environment& env, transport& wire, device_memory* memory,
                 std::function<void()> on_settled);
  ~worker_staging();
  worker_staging(const worker_staging&) = delete;
  worker_staging& operator=(const worker_staging&) = delete;

  /// At least `slots`' receive slots (on the GPU when `slots.receive_on_device` and they fit
  /// there, else in host memory) and its broadcast slots on the GPU, for chunks of up to
  /// `chunk_bytes`. Says what failed, or nothing.
  std::optional<std::string> prepare(const worker_slots& slots, std::uint64_t chunk_bytes);
  /// The receive slots' region, as trainers write into it; none before `prepare`.
  const std::optional<region_desc>& region() const { return region_; }
  /// Bytes of each receive slot below the direct ones (worker_slots::slot_bytes).
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  /// Whether the receive slots are on the GPU (no host byte to hash, no upload).
  bool on_device() const { return device_ != nullptr; }
  /// Whether every write an older key let in has ended.
  bool settled() const { return settled_; }
  /// `bytes` of receive slot `slot` (at most the slot's), as a collective sees it (region and
  /// offset, or device).
  buffer_ref receive_slot(std::uint32_t slot, std::uint64_t bytes) const;
  /// `bytes` of broadcast slot `slot` on the GPU.
  buffer_ref broadcast_slot(std::uint32_t slot, std::uint64_t bytes) const;

 private:
  /// New receive slots of `bytes`, registered: what failed, or nothing.
  std::optional<std::string> allocate(std::size_t bytes, bool on_device);
  void release();
  /// Gives the kept region a new key and waits for the older writes.
  void rekey();

  environment& env_;
  transport& wire_;
  device_memory* memory_;
  std::function<void()> on_settled_;
  std::uint64_t chunk_bytes_ = 0;
  std::uint32_t first_direct_ = 0;  ///< receive slots below it are `slot_bytes_` (worker_slots)
  std::uint64_t slot_bytes_ = 0;
  host_buffer host_;             ///< receive slots in host memory
  std::byte* device_ = nullptr;  ///< receive slots on the GPU
  std::size_t bytes_ = 0;        ///< of the receive slots
  std::optional<region_desc> region_;
  std::byte* broadcast_ = nullptr;  ///< broadcast slots on the GPU
  std::size_t broadcast_bytes_ = 0;
  /// Slots of older epochs, until the worker goes: their work may still read them.
  std::vector<host_buffer> retired_host_;
  std::vector<std::byte*> retired_device_;
  bool device_refused_ = false;  ///< the GPU had no room for the receive slots once: host memory
  bool settled_ = true;
  std::uint64_t rekeys_ = 0;
  /// False once destroyed: the transport's call back (`when_writes_end`) may come later.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ferry
