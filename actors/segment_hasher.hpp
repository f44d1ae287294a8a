#pragma once
/// xxh3-128 digests of byte ranges that may lie in device memory, for the end-to-end verdict: a
/// device range is copied into a pinned host buffer first (sized to the largest range asked for,
/// pinned once), then hashed on the environment's executor.
#include <xxhash.h>

#include <span>

#include "runtime/device_memory.hpp"
#include "runtime/environment.hpp"
#include "runtime/host_buffer.hpp"

namespace ferry {

/// Owning loop only.
class segment_hasher {
 public:
  /// `memory`: the device that device ranges live on, which pins the host buffer; null on hosts.
  segment_hasher(environment& env, device_memory* memory) : env_(env), memory_(memory) {}
  ~segment_hasher();
  segment_hasher(const segment_hasher&) = delete;
  segment_hasher& operator=(const segment_hasher&) = delete;

  /// Fiber only. The digest of `bytes`, which lie on the device when `on_device`; the copy's
  /// error when they could not be read.
  result<XXH128_hash_t> hash(std::span<const std::byte> bytes, bool on_device);

 private:
  environment& env_;
  device_memory* memory_;
  host_buffer bounce_;
};

}  // namespace ferry
