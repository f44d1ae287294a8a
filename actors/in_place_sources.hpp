#pragma once
/// The trainers' copies a worker reads in place instead of receiving writes: a trainer's shared
/// host copy (a memfd, pinned for the worker's GPU) or its device copies (device-direct: CUDA VMM
/// memory, copied GPU to GPU). Each is mapped once, on first use, and kept until its trainer's
/// process is gone; a chunk that reads one holds it, so it is unmapped only once its last reader
/// is done.
#include <map>
#include <memory>
#include <span>
#include <string>

#include "actors/messages.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

/// One trainer copy mapped here.
struct mapped_source {
  host_buffer host;                 ///< a shared host copy; empty for device copies
  device_memory* pinned = nullptr;  ///< the host copy is unpinned from it when it goes
  std::unique_ptr<shared_device_buffer> device;
  ~mapped_source();
  std::span<std::byte> bytes() const { return device ? device->bytes() : host.span(); }
};

/// Owning loop only.
class in_place_sources {
 public:
  /// `memory`: the worker's device (host copies are pinned for it, device copies mapped for it);
  /// null on hosts.
  /// `owner` names the member in logs.
  in_place_sources(environment& env, device_memory* memory, std::string owner)
      : env_(env), memory_(memory), owner_(std::move(owner)) {}

  /// A chunk's bytes in a trainer's copy, and the mapping that holds them.
  struct chunk_bytes {
    std::shared_ptr<const mapped_source> copy;
    std::span<std::byte> bytes;
    bool on_device = false;
  };
  /// Fiber only. The `bytes` bytes of a chunk that `m` says lie in a trainer's copy
  /// (`m.in_place()`), mapped on first use. `errc::stopped` when the trainer's process is gone
  /// (a regroup follows); `errc::invalid_argument`, saying why, when they cannot be read here.
  result<chunk_bytes> chunk(const chunk_sent& m, std::uint64_t bytes, std::string& why);
  /// Lets go of the copies whose processes are gone (chunks reading one keep it).
  void forget_dead();

 private:
  std::shared_ptr<const mapped_source> host_copy(const shared_memory_ref& ref, std::string& why);
  std::shared_ptr<const mapped_source> device_copies(const shared_device_ref& ref,
                                                     std::string& why);

  environment& env_;
  device_memory* memory_;
  std::string owner_;
  std::map<shared_memory_ref, std::shared_ptr<const mapped_source>> host_;
  std::map<shared_device_ref, std::shared_ptr<const mapped_source>> device_;
};

}  // namespace ferry
