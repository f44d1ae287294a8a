#include "transport/tcp/handshake_budget.hpp"

#include <algorithm>

namespace ferry {

handshake_budget::verdict handshake_budget::consider(
    const address& from, time_point now, const std::function<bool(std::uint64_t)>& spoke) const {
  // Idle connections hold a slot for nothing; a stale one will not finish in time either.
  auto closable = [&](const entry& e) {
    return now - e.since >= limits_.stale_after || !spoke(e.id);
  };
  if (count(from) >= limits_.max_per_address) {
    constexpr std::string_view limit = "max_unauthenticated_per_address";
    // Only a connection of the same address frees room in that address's share.
    for (const auto& e : entries_) {
      if (e.from == from && closable(e)) return {.admit = true, .evict = e.id, .limit = limit};
    }
    return {.admit = false, .limit = limit};
  }
  if (entries_.size() < limits_.max_total) return {.admit = true};
  constexpr std::string_view limit = "max_unauthenticated";
  // The address holding the most connections gives one up, its oldest closable one: an address
  // with few connections in flight (a real peer) is the last to lose one.
  const entry* victim = nullptr;
  std::size_t victim_share = 0;
  for (const auto& e : entries_) {
    if (!closable(e)) continue;
    const auto share = count(e.from);
    if (!victim || share > victim_share) {
      victim = &e;
      victim_share = share;
    }
  }
  if (!victim) return {.admit = false, .limit = limit};
  return {.admit = true, .evict = victim->id, .limit = limit};
}

void handshake_budget::add(std::uint64_t id, const address& from, time_point now) {
  entries_.push_back({.id = id, .from = from, .since = now});
}

void handshake_budget::remove(std::uint64_t id) {
  std::erase_if(entries_, [id](const entry& e) { return e.id == id; });
}

std::size_t handshake_budget::count(const address& from) const {
  return static_cast<std::size_t>(std::count_if(entries_.begin(), entries_.end(),
                                                [&](const entry& e) { return e.from == from; }));
}

}  // namespace ferry
