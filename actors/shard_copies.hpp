#pragma once
/// A trainer shard's copies of the versions it publishes: two, alternating by version parity, so
/// that a late joiner can be served the delivered version while the next one is offloaded. Host
/// copies (pinned for the shard's device, registered with the transport, in a memfd when leaders
/// read them in place) serve the workers that receive writes; device copies (the device's memory
/// that other processes map) serve the workers reached GPU to GPU: read in place on one host, or
/// written from by the transport (GPUDirect RDMA). The plan says which kinds the
/// shard keeps; each is allocated when first needed and reused by every version and epoch while
/// its size fits.
#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/plan.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"
#include "runtime/host_buffer.hpp"
#include "runtime/transport.hpp"

namespace ferry {

/// Owning loop only.
class shard_copies {
 public:
  /// One version's copies: a half of each kind kept (an empty span where a kind is not).
  struct version_copy {
    std::span<std::byte> host, device;
    std::uint64_t offset = 0;  ///< of both halves in their buffers
    std::uint64_t version = 0;
    std::uint64_t layout = 0;              ///< the plan layout `version` was packed in
    std::vector<bool> in_host, in_device;  ///< per plan chunk: its bytes of `version` are there
    std::vector<std::uint64_t> checksums;  ///< per plan chunk, of the host copy's bytes
  };

  /// `memory`: the shard's device (null: its tensors are in host memory).
  shard_copies(environment& env, transport& wire, device_memory* memory)
      : env_(env), wire_(wire), memory_(memory) {}
  ~shard_copies();
  shard_copies(const shard_copies&) = delete;
  shard_copies& operator=(const shard_copies&) = delete;

  /// Makes the kinds `kept` of `bytes` per version exist (host copies `shareable` or not); a
  /// change of size drops every version held. Says what failed, or nothing.
  std::optional<std::string> prepare(std::uint64_t bytes, plan::shard_copies kept, bool shareable);
  /// The copy `version` goes into (the one of its parity).
  version_copy& for_version(std::uint64_t version) { return copies_[version % 2]; }
  /// The copy holding `version`, or null.
  version_copy* holding(std::uint64_t version);
  /// The copies that hold a version in device copies only: the host copies were made after.
  std::vector<version_copy*> missing_from_host();
  /// Whether the plan has workers read the device copies, and whether it has others, which the
  /// host copies serve.
  plan::shard_copies kept() const { return kept_; }

  shared_memory_ref host_ref() const { return host_.shared_ref(); }
  shared_device_ref device_ref() const { return device_ ? device_->ref() : shared_device_ref{}; }

 private:
  void release_host();
  void release_device();

  environment& env_;
  transport& wire_;
  device_memory* memory_;
  std::uint64_t bytes_ = 0;  ///< per version
  plan::shard_copies kept_;
  /// Both versions' host copies in one buffer, so a leader maps and pins both at once.
  host_buffer host_;
  std::optional<region_desc> host_region_;
  std::unique_ptr<shared_device_buffer> device_;
  std::optional<region_desc> device_region_;  ///< where the transport writes from them (GPUDirect)
  /// Copies of older layouts, until the shard goes: an offload or a send of the old layout may
  /// still touch them (the new plan stops them at their next step).
  std::vector<host_buffer> retired_host_;
  std::vector<std::unique_ptr<shared_device_buffer>> retired_device_;
  std::array<version_copy, 2> copies_;
};

}  // namespace ferry
