#pragma once
/// The regions a node registered, and the receiver-side check of every incoming write:
/// known region, matching key, in bounds. Shared by the transports that land bytes themselves.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/transport.hpp"
#include "transport/errc.hpp"

namespace ferry {

/// Thread-safe: the inproc transport resolves writes from other threads.
class region_table {
 public:
  explicit region_table(node_id owner) : owner_(owner) {}

  /// Registers `memory` with a fresh id and a random key; `addr` is 0 (writes use offsets).
  region_desc add(std::span<std::byte> memory);
  /// Waits for the `land` calls under way into it (other threads' copies), so that its owner may
  /// free the memory once this returns.
  void remove(std::uint64_t id);
  /// Gives region `id` a fresh random key, keeping its id and memory: from now on a write that
  /// presents the old key is refused.
  result<region_desc> rekey(std::uint64_t id);

  /// The destination bytes of a write, or why it must be refused.
  result<std::span<std::byte>> resolve(std::uint64_t id, std::uint64_t key, std::uint64_t offset,
                                       std::uint64_t length) const;
  /// The same, and the write is under way until `end_write(id)`: from its check to its last byte,
  /// its refusal or its link's loss.
  result<std::span<std::byte>> begin_write(std::uint64_t id, std::uint64_t key,
                                           std::uint64_t offset, std::uint64_t length);
  void end_write(std::uint64_t id);
  /// Runs `copy`, which writes into region `id`'s memory from another thread than the owner's,
  /// unless the region was removed (ids are never reused). Returns whether it ran.
  bool land(std::uint64_t id, const std::function<void()>& copy);
  /// Whether a write into region `id` is under way. If so, `done` runs once none is, on the
  /// thread that ends the last (or removes the region); else never.
  bool when_writes_end(std::uint64_t id, std::function<void()> done);
  /// True when `local` lies inside one registered region.
  bool contains(std::span<const std::byte> local) const;
  std::size_t size() const;

 private:
  /// `resolve` with the mutex held.
  result<std::span<std::byte>> check(std::uint64_t id, std::uint64_t key, std::uint64_t offset,
                                     std::uint64_t length) const;
  struct entry {
    std::span<std::byte> memory;
    std::uint64_t key;
    std::uint32_t writing = 0;  ///< writes under way
    std::vector<std::function<void()>> when_ended;
  };
  node_id owner_;
  mutable std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, entry> regions_;
  std::map<std::uint64_t, std::uint32_t> landing_;  ///< `land` calls under way per region
  std::condition_variable landed_;
};

}  // namespace ferry
