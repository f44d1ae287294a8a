#include "actors/direct_slot_grants.hpp"

#include <algorithm>

namespace ferry {

direct_slot_grants::direct_slot_grants(std::uint32_t count, std::uint32_t shards,
                                       std::uint32_t first_shard)
    : granted_(count),
      shards_(std::max(shards, 1u)),
      next_shard_(first_shard % std::max(shards, 1u)) {
  for (std::uint32_t i = 0; i < count; ++i) free_.push_back(i);
}

void direct_slot_grants::request(const address& trainer, std::uint32_t shard,
                                 const slot_request& m) {
  requests_.push_back({.trainer = trainer, .shard = shard, .request = m});
}

direct_slot_grants::waiting direct_slot_grants::take_next() {
  const auto distance = [&](const waiting& w) {
    return (w.shard + shards_ - next_shard_) % shards_;
  };
  const auto next =
      std::min_element(requests_.begin(), requests_.end(),
                       [&](const auto& a, const auto& b) { return distance(a) < distance(b); });
  const auto taken = *next;
  requests_.erase(next);
  return taken;
}

void direct_slot_grants::release(std::uint32_t index) {
  granted_.at(index).reset();
  free_.push_back(index);
}

}  // namespace ferry
