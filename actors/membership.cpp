#include "actors/membership.hpp"

#include <algorithm>

namespace ferry {

job_membership::interned_table job_membership::intern(const shared_vector<tensor_spec>& tensors,
                                                      const shared_vector<byte_range>& parts) {
  std::erase_if(tables_, [](const auto& t) { return t.expired(); });
  for (const auto& t : tables_)
    if (auto live = t.lock(); live && live->tensors == tensors && live->parts == parts)
      return {live, false};
  auto table =
      std::make_shared<const worker_table>(worker_table{.tensors = tensors, .parts = parts});
  tables_.push_back(table);
  return {table, true};
}

std::map<std::uint32_t, job_membership::trainer_entry>::iterator job_membership::find_trainer(
    const address& who) {
  return std::find_if(trainers.begin(), trainers.end(),
                      [&](const auto& t) { return t.second.who == who; });
}

const job_membership::worker_entry* job_membership::find_worker(const address& who) const {
  const auto w = std::find_if(workers.begin(), workers.end(),
                              [&](const auto& e) { return e.second.who == who; });
  return w == workers.end() ? nullptr : &w->second;
}

bool job_membership::is_member(node_id node) const {
  return std::any_of(trainers.begin(), trainers.end(),
                     [&](const auto& t) { return t.second.who.node == node; }) ||
         std::any_of(workers.begin(), workers.end(),
                     [&](const auto& w) { return w.second.who.node == node; });
}

bool job_membership::all_declared(std::uint32_t trainer_count,
                                  const std::vector<std::uint32_t>& instance_sizes) const {
  if (trainers.size() != trainer_count) return false;
  for (std::uint32_t i = 0; i < instance_sizes.size(); ++i) {
    const auto first = workers.lower_bound({i, 0}), end = workers.lower_bound({i + 1, 0});
    if (static_cast<std::uint32_t>(std::distance(first, end)) < instance_sizes[i]) return false;
  }
  return true;
}

bool job_membership::all_workers_ready() const {
  return std::all_of(workers.begin(), workers.end(), [](const auto& e) { return e.second.ready; });
}

std::vector<node_id> job_membership::silent(clock::time_point now, clock::duration timeout) const {
  std::vector<node_id> quiet;
  for_each([&](const address& who) {
    auto it = last_seen.find(who.node);
    if (it != last_seen.end() && now - it->second > timeout) quiet.push_back(who.node);
  });
  return quiet;
}

void job_membership::give_up(node_id node, given_up_entry entry) {
  if (given_up.size() >= 1024) given_up.erase(given_up.begin());
  given_up[node] = std::move(entry);
}

}  // namespace ferry
