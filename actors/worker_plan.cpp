#include "actors/worker_plan.hpp"

#include <algorithm>

namespace ferry {

std::string worker_plan::derive(const std::shared_ptr<const std::vector<tensor_ref>>& local,
                                const address& self, const instance_plan& inst) {
  index = plan_index::of(job);
  if (!index->flaw().empty()) return index->flaw();
  placement = tensor_placement::shared(index, local);
  // Asked once per audience, not per segment and chunk: a Kimi-K2 plan has 140k segments, and
  // far fewer audiences.
  std::vector<bool> heard(job->audiences.size()), whole(job->audiences.size());
  for (std::uint32_t a = 0; a < job->audiences.size(); ++a) {
    heard[a] = job->hears(a, self);
    whole[a] = heard[a] && job->whole_instance(inst, a);
  }
  // What this worker hears must lie in what it holds (a worker that took the trainers' table sees
  // it change when a trainer comes back with another).
  for (std::uint32_t a = 0; a < job->audiences.size(); ++a) {
    if (!heard[a]) continue;
    const auto before = heard_segments.size();
    for (const auto i : index->segments_of(a)) {
      const auto& s = job->segments[i];
      const auto at = placement->local_index(s.tensor);
      if (at < 0)
        return "publishes tensor '" + job->tensors[s.tensor].name +
               "', which this worker does not hold";
      const auto held = (*local)[at].held();
      if (s.offset < held.offset || s.offset + s.bytes > held.end()) {
        return "sends bytes of tensor '" + job->tensors[s.tensor].name +
               "' this worker does not hold";
      }
      heard_segments.push_back(i);
    }
    // Kept in plan order, as the digests report them: each audience's segments are.
    std::inplace_merge(heard_segments.begin(),
                       heard_segments.begin() + static_cast<std::ptrdiff_t>(before),
                       heard_segments.end());
  }
  mine.assign(job->chunks.size(), false);
  heard_directly.assign(job->chunks.size(), false);
  for (const auto& c : job->chunks) {
    if (!heard[c.audience]) continue;
    mine[c.id] = true;
    ++mine_count;
    heard_directly[c.id] = !whole[c.audience];
    direct = direct || !whole[c.audience];
  }
  return {};
}

std::vector<address> collective_ranks(const instance_plan& inst) {
  // The leaders in stripe order (rank s owns stripe s), then the others.
  std::vector<address> members;
  for (auto l : inst.leaders) members.push_back(inst.workers.at(l));
  for (const auto& w : inst.workers) {
    if (std::find(members.begin(), members.end(), w) == members.end()) members.push_back(w);
  }
  return members;
}

}  // namespace ferry
