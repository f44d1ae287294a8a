#pragma once
/// The direct slots a rollout worker grants, chunk by chunk, to the trainer shards that send it
/// chunks its instance does not hear whole: a few slots however many trainers send to it, granted
/// round the shards from a first shard of the worker's own, so that no trainer is asked by every
/// worker at once while others idle.
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "actors/messages.hpp"

namespace ferry {

/// Owning actor only.
class direct_slot_grants {
 public:
  struct grant {
    address trainer;
    std::uint64_t version = 0;
    std::uint32_t chunk = 0;
  };

  direct_slot_grants() = default;
  /// `count` slots, numbered from 0, granted first to shard `first_shard` of `shards`.
  direct_slot_grants(std::uint32_t count, std::uint32_t shards, std::uint32_t first_shard);

  std::uint32_t count() const { return static_cast<std::uint32_t>(granted_.size()); }
  /// Shard `shard`'s `trainer` asks for a slot for `m.chunk` of `m.version`: it waits its turn.
  void request(const address& trainer, std::uint32_t shard, const slot_request& m);
  /// Grants free slots to the requests waiting, to the next shard round from the last one granted
  /// that asked; `send(trainer, grant)` for each, its slot numbered from 0.
  template <class Send>
  void grant_free_slots(Send send);
  /// What slot `index` was granted for, if it is granted.
  const std::optional<grant>& granted(std::uint32_t index) const { return granted_.at(index); }
  /// Slot `index`'s chunk is done with: the slot is free again.
  void release(std::uint32_t index);

 private:
  struct waiting {
    address trainer;
    std::uint32_t shard = 0;
    slot_request request;
  };
  /// Takes the waiting request whose shard comes next from `next_shard_`.
  waiting take_next();

  std::vector<std::optional<grant>> granted_;
  std::deque<std::uint32_t> free_;
  std::deque<waiting> requests_;  ///< in the order they came
  std::uint32_t shards_ = 1;
  std::uint32_t next_shard_ = 0;
};

template <class Send>
void direct_slot_grants::grant_free_slots(Send send) {
  while (!free_.empty() && !requests_.empty()) {
    const auto next = take_next();
    const auto index = free_.front();
    free_.pop_front();
    granted_[index] = grant{
        .trainer = next.trainer, .version = next.request.version, .chunk = next.request.chunk};
    next_shard_ = (next.shard + 1) % shards_;
    send(next.trainer,
         slot_grant{.version = next.request.version, .chunk = next.request.chunk, .slot = index});
  }
}

}  // namespace ferry
