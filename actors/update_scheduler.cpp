#include "actors/update_scheduler.hpp"

namespace ferry {

void update_scheduler::published(std::uint64_t version, std::optional<std::uint32_t> shard) {
  published_ = std::max(published_, version);
  if (version > delivered_) pending_.insert(version);
  if (shard) publishers_[version].insert(*shard);
}

std::vector<update_scheduler::skipped_version> update_scheduler::skipped(
    const job_membership& members) const {
  std::vector<skipped_version> out;
  for (const auto v : pending_) {
    const auto publishers = publishers_.find(v);
    for (const auto& [shard, t] : members.trainers) {
      if (t.last_published > v &&
          (publishers == publishers_.end() || !publishers->second.contains(shard))) {
        out.push_back({.version = v, .shard = shard, .shard_published = t.last_published});
        break;
      }
    }
  }
  return out;
}

std::optional<update_scheduler::update> update_scheduler::next(
    const job_membership& members) const {
  if (active_) return std::nullopt;
  const bool copies_hold_delivered =
      std::all_of(members.trainers.begin(), members.trainers.end(),
                  [&](const auto& t) { return t.second.first_version <= delivered_; });
  if (delivered_ > 0 && copies_hold_delivered) {
    for (const auto& [key, w] : members.workers) {
      if (w.complete_version < delivered_) return update{.version = delivered_, .catch_up = true};
    }
  }
  for (const auto v : pending_) {
    if (!failed_.contains(v)) return update{.version = v};
  }
  return std::nullopt;
}

update_scheduler::update update_scheduler::complete() {
  const auto done = *active_;
  active_.reset();
  if (!done.catch_up) {
    delivered_ = done.version;
    pending_.erase(pending_.begin(), pending_.upper_bound(done.version));
    publishers_.erase(publishers_.begin(), publishers_.upper_bound(done.version));
  }
  return done;
}

update_scheduler::instance_sends update_scheduler::what_travels(const plan& p,
                                                                const instance_plan& inst,
                                                                const job_membership& members,
                                                                std::uint64_t version) {
  std::vector<const job_membership::worker_entry*> ranks;
  for (const auto& w : inst.workers) ranks.push_back(members.find_worker(w));
  instance_sends out{.direct = std::vector<std::vector<std::uint32_t>>(ranks.size())};
  std::map<std::uint32_t, std::vector<std::uint32_t>> hearers;  // audience -> ranks
  for (const auto& c : p.chunks) {
    auto [it, fresh] = hearers.emplace(c.audience, std::vector<std::uint32_t>{});
    if (fresh) it->second = p.hearers(inst, c.audience);
    const auto& hear = it->second;
    const auto lacks = [&](std::uint32_t r) { return ranks[r] && !ranks[r]->holds(version, c.id); };
    if (hear.size() == ranks.size()) {
      if (std::any_of(hear.begin(), hear.end(), lacks)) out.through_leaders.push_back(c.id);
    } else {
      for (auto r : hear) {
        if (lacks(r)) out.direct[r].push_back(c.id);
      }
    }
  }
  return out;
}

std::vector<update_go> update_scheduler::orders_by_shard(const plan& p, std::uint64_t version,
                                                         std::span<const route_chunks> routes) {
  std::vector<update_go> orders(p.shards.size(), update_go{.version = version});
  for (const auto& r : routes) {
    for (auto& o : orders) o.routes.push_back({.route = r.route});
    for (const auto id : r.chunks) orders[p.chunks[id].shard].routes.back().chunks.push_back(id);
  }
  return orders;
}

}  // namespace ferry
