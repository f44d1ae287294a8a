#pragma once
/// Who is in the job, as the coordinator sees it: the trainer shards and rollout workers that
/// registered, what each registered and offered, when each was last heard from, and the members
/// given up while their links were cut. The coordinator decides what changes; this keeps the
/// tables and answers questions about them.
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/clock.hpp"

namespace ferry {

class job_membership {
 public:
  using worker_key = std::pair<std::uint32_t, std::uint32_t>;  ///< instance, rank
  struct trainer_entry {
    address who;
    std::string transport_address;
    std::vector<tensor_spec> tensors;
    device_place place;
    std::uint64_t first_version =
        1;  ///< the oldest version its host copies can hold (it joined then)
    std::uint64_t last_published = 0;
  };
  /// What a worker registered. Workers of one part register equal tables (Kimi-K2's 128
  /// whole-model workers: 140k tensors each), which share one copy (`intern`).
  struct worker_table {
    shared_vector<tensor_spec> tensors;
    shared_vector<byte_range> parts;  ///< parallel to `tensors`, or empty: whole tensors
  };
  struct worker_entry {
    address who;
    std::string transport_address;
    std::shared_ptr<const worker_table> table;
    bool on_device = false;
    device_place place;
    bool ready = false;
    std::optional<region_desc> slots;
    std::uint32_t direct_slot = 0;  ///< the first of the slots for chunks sent to it alone
    std::uint64_t slot_bytes = 0;   ///< of each slot below `direct_slot`
    std::uint64_t complete_version = 0;
    std::uint64_t partial_version = 0;
    std::set<std::uint32_t> partial_chunks;
    bool holds(std::uint64_t version, std::uint32_t chunk) const {
      return complete_version >= version ||
             (partial_version == version && partial_chunks.contains(chunk));
    }
  };
  /// A member declared lost (silent, or its link dropped), not left: one that heartbeats again
  /// (its link was cut and came back) is asked to register again, unless its place was taken.
  struct given_up_entry {
    address who;
    std::string transport_address;
    std::optional<std::uint32_t> shard;
    std::optional<worker_key> worker;
    std::uint64_t delivered = 0;  ///< the job's delivered version when it was given up
  };

  std::map<std::uint32_t, trainer_entry> trainers;
  std::map<worker_key, worker_entry> workers;
  std::map<node_id, clock::time_point> last_seen;
  std::map<node_id, given_up_entry> given_up;

  struct interned_table {
    std::shared_ptr<const worker_table> table;
    bool fresh = false;  ///< no live table was equal: this one is new
  };
  /// The live table equal to `tensors` and `parts`, or a new one of these two, shared from now on.
  interned_table intern(const shared_vector<tensor_spec>& tensors,
                        const shared_vector<byte_range>& parts);
  /// The shard `who` registered as, or trainers.end().
  std::map<std::uint32_t, trainer_entry>::iterator find_trainer(const address& who);
  const worker_entry* find_worker(const address& who) const;
  bool is_member(node_id node) const;
  /// Whether `trainers` shards and, for each instance i below `instance_sizes.size()`, that many
  /// workers registered: what the first plan waits for.
  bool all_declared(std::uint32_t trainer_count,
                    const std::vector<std::uint32_t>& instance_sizes) const;
  bool all_workers_ready() const;
  /// Members not heard from since `now - timeout`.
  std::vector<node_id> silent(clock::time_point now, clock::duration timeout) const;
  /// Remembers a lost member for its return; the oldest are forgotten past 1024.
  void give_up(node_id node, given_up_entry entry);
  /// Every member's address: trainers by shard, then workers by instance and rank.
  template <class F>
  void for_each(F f) const {
    for (const auto& [shard, t] : trainers) f(t.who);
    for (const auto& [key, w] : workers) f(w.who);
  }

 private:
  std::vector<std::weak_ptr<const worker_table>> tables_;  ///< registered, for `intern`
};

}  // namespace ferry
