#include "actors/plan.hpp"

#include <unordered_map>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace ferry {

std::uint64_t plan::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.bytes;
  return n;
}

std::vector<std::uint32_t> plan::chunks_of(std::uint32_t shard) const {
  std::vector<std::uint32_t> ids;
  for (const auto& c : chunks) {
    if (c.shard == shard) ids.push_back(c.id);
  }
  return ids;
}

std::vector<int> plan::indices_in(std::span<const std::string_view> names) const {
  std::unordered_map<std::string_view, int> index;
  index.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) index.emplace(names[i], static_cast<int>(i));
  std::vector<int> out(tensors.size(), -1);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (const auto it = index.find(tensors[i].name); it != index.end()) out[i] = it->second;
  }
  return out;
}

bool plan::hears(std::uint32_t audience, const address& worker) const {
  if (audience == 0) return true;
  const auto& who = audiences.at(audience);
  return std::binary_search(who.begin(), who.end(), worker);
}

std::vector<std::uint32_t> plan::hearers(const instance_plan& inst, std::uint32_t audience) const {
  std::vector<std::uint32_t> ranks;
  for (std::uint32_t r = 0; r < inst.workers.size(); ++r) {
    if (hears(audience, inst.workers[r])) ranks.push_back(r);
  }
  return ranks;
}

bool plan::whole_instance(const instance_plan& inst, std::uint32_t audience) const {
  return audience == 0 || hearers(inst, audience).size() == inst.workers.size();
}

std::uint64_t plan::bytes_for(const address& worker) const {
  std::uint64_t n = 0;
  for (const auto& c : chunks) {
    if (hears(c.audience, worker)) n += c.bytes;
  }
  return n;
}

namespace {
std::uint64_t align_up(std::uint64_t n) { return (n + tensor_alignment - 1) / tensor_alignment * tensor_alignment; }

constexpr std::uint32_t unclaimed = std::numeric_limits<std::uint32_t>::max();  ///< a segment nobody registered

std::string bytes_of(const tensor_segment& s, const plan& p) {
  return "bytes [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.bytes) + ") of tensor '" +
         p.tensors[s.tensor].name + "'";
}

/// Each tensor cut where a selective worker's range starts or ends. A segment's audience is every
/// worker that hears all of it: those without a selection, and those whose range covers it;
/// audiences are interned into `p.audiences`, `unclaimed` when nobody registered the segment.
std::vector<tensor_segment> cut_segments(plan& p, const std::map<address, std::vector<tensor_range>>& selections) {
  std::vector<address> whole;  // workers without a selection
  for (const auto& inst : p.instances) {
    for (const auto& w : inst.workers) {
      if (!selections.contains(w)) whole.push_back(w);
    }
  }
  std::unordered_map<std::string_view, std::vector<std::pair<address, byte_range>>> wants;
  for (const auto& [who, ranges] : selections) {
    for (const auto& r : ranges) wants[r.name].emplace_back(who, r.range);
  }
  std::map<std::vector<address>, std::uint32_t> interned;
  auto audience_of = [&](std::vector<address> covering) {
    if (covering.size() == selections.size()) return 0u;  // every selective worker, and the others
    covering.insert(covering.end(), whole.begin(), whole.end());
    if (covering.empty()) return unclaimed;
    std::sort(covering.begin(), covering.end());
    const auto [it, fresh] = interned.emplace(covering, static_cast<std::uint32_t>(p.audiences.size()));
    if (fresh) p.audiences.push_back(std::move(covering));
    return it->second;
  };
  std::vector<tensor_segment> out;
  out.reserve(p.tensors.size());
  for (std::uint32_t i = 0; i < p.tensors.size(); ++i) {
    const auto nbytes = p.tensors[i].nbytes;
    const auto it = wants.find(p.tensors[i].name);
    if (it == wants.end()) {
      out.push_back({.tensor = i, .bytes = nbytes, .audience = audience_of({})});
      continue;
    }
    std::vector<std::uint64_t> cuts{0, nbytes};
    for (const auto& [who, r] : it->second) {
      cuts.push_back(std::min(r.offset, nbytes));
      cuts.push_back(std::min(r.end(), nbytes));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      std::vector<address> covering;
      for (const auto& [who, r] : it->second) {
        if (r.offset <= cuts[k] && r.end() >= cuts[k + 1]) covering.push_back(who);
      }
      out.push_back({.tensor = i, .offset = cuts[k], .bytes = cuts[k + 1] - cuts[k], .audience = audience_of(covering)});
    }
  }
  return out;
}

/// Every segment has a hearer in every instance.
result<void> check_coverage(const plan& p, std::span<const tensor_segment> segments, std::string& why) {
  for (const auto& inst : p.instances) {
    std::map<std::uint32_t, bool> heard;  // audience -> some member of `inst` hears it
    for (const auto& s : segments) {
      if (s.audience == unclaimed) {
        why = "no worker registered " + bytes_of(s, p) + " (every instance must hold the whole model)";
        return fail(errc::invalid_argument);
      }
      auto [it, fresh] = heard.emplace(s.audience, false);
      if (fresh) it->second = !p.hearers(inst, s.audience).empty();
      if (!it->second) {
        why = "instance " + std::to_string(inst.id) + " leaves " + bytes_of(s, p) + " unclaimed: none of its " +
              std::to_string(inst.workers.size()) + " worker(s) registered them";
        return fail(errc::invalid_argument);
      }
    }
  }
  return {};
}
}  // namespace

result<void> check_registration(std::span<const tensor_spec> tensors, const job_limits& limits,
                                std::string& why) {
  if (tensors.size() > limits.max_tensors) {
    why = "max_tensors: " + std::to_string(tensors.size()) + " tensors registered, the limit is " +
          std::to_string(limits.max_tensors);
    return fail(errc::invalid_argument);
  }
  for (const auto& t : tensors) {
    if (t.name.size() > limits.max_tensor_name_bytes) {
      why = "max_tensor_name_bytes: a tensor name of " + std::to_string(t.name.size()) +
            " bytes ('" + t.name.substr(0, 32) + "...'), the limit is " +
            std::to_string(limits.max_tensor_name_bytes);
      return fail(errc::invalid_argument);
    }
  }
  return {};
}

result<void> region_budget::offer(node_id peer, std::uint32_t epoch, const region_desc& region,
                                  const job_limits& limits, std::string& why) {
  auto& o = offered_[peer];
  if (o.epoch != epoch) o = {.epoch = epoch};
  if (!o.ids.contains(region.id) && o.ids.size() >= limits.max_regions_per_peer) {
    why = "max_regions_per_peer: node " + std::to_string(peer) + " offered " + std::to_string(o.ids.size() + 1) +
          " regions in epoch " + std::to_string(epoch) + ", the limit is " + std::to_string(limits.max_regions_per_peer);
    return fail(errc::invalid_argument);
  }
  o.ids.insert(region.id);
  return {};
}

result<plan> make_plan(const plan_inputs& in, std::string& why) {
  auto refuse = [&](std::string reason) {
    why = std::move(reason);
    return fail(errc::invalid_argument);
  };
  if (in.chunk_bytes < tensor_alignment || in.chunk_bytes % tensor_alignment != 0) {
    return refuse("chunk size " + std::to_string(in.chunk_bytes) + " must be a positive multiple of the " +
                  std::to_string(tensor_alignment) + "-byte alignment");
  }
  if (in.depth == 0) return refuse("depth must be at least 1");
  if (in.shard_tensors.empty() || in.shard_tensors.size() != in.shards.size()) {
    return refuse("a plan needs at least one trainer shard");
  }
  if (in.instances.empty()) return refuse("a plan needs at least one rollout instance");

  // Limits first, from sizes alone: nothing is allocated for a plan that would break one.
  std::uint64_t tensor_count = 0, chunk_count = 0;
  for (const auto& table : in.shard_tensors) {
    if (!check_registration(table, in.limits, why)) return fail(errc::invalid_argument);
    tensor_count += table.size();
    std::uint64_t stream = 0;
    for (const auto& t : table) {
      // Saturates instead of wrapping: a lying nbytes must not make a small chunk count.
      constexpr auto top = std::numeric_limits<std::uint64_t>::max();
      const std::uint64_t start = stream > top - tensor_alignment ? top : align_up(stream);
      stream = t.nbytes > top - start ? top : start + t.nbytes;
    }
    chunk_count += stream / in.chunk_bytes + (stream % in.chunk_bytes != 0);
  }
  if (tensor_count > in.limits.max_tensors) {
    return refuse("max_tensors: the plan has " + std::to_string(tensor_count) + " tensors, the limit is " +
                  std::to_string(in.limits.max_tensors));
  }
  if (chunk_count > in.limits.max_chunks) {
    return refuse("max_chunks: the plan needs " + std::to_string(chunk_count) + " chunks of " +
                  std::to_string(in.chunk_bytes) + " bytes, the limit is " + std::to_string(in.limits.max_chunks));
  }

  plan p;
  p.epoch = in.epoch;
  p.chunk_bytes = in.chunk_bytes;
  p.depth = in.depth;
  p.shared_host_copies = in.shared_host_copies;
  p.shards = in.shards;
  std::map<std::string, std::uint32_t> owner_of;
  for (std::uint32_t s = 0; s < in.shard_tensors.size(); ++s) {
    const auto& table = in.shard_tensors[s];
    if (!validate_tensor_table(table, why)) return fail(errc::invalid_argument);
    for (const auto& t : table) {
      if (auto [it, fresh] = owner_of.emplace(t.name, s); !fresh) {
        return refuse("tensor '" + t.name + "' is owned by shards " + std::to_string(it->second) + " and " +
                      std::to_string(s));
      }
      p.tensors.push_back(t);
      p.owner.push_back(s);
    }
  }
  for (auto inst : in.instances) {
    if (inst.workers.empty()) return refuse("instance " + std::to_string(inst.id) + " has no workers");
    if (inst.leaders.empty()) inst.leaders = {0};
    for (auto l : inst.leaders) {
      if (l >= inst.workers.size()) return refuse("instance " + std::to_string(inst.id) + " names a leader rank past its size");
    }
    if (std::set(inst.leaders.begin(), inst.leaders.end()).size() != inst.leaders.size())
      return refuse("instance " + std::to_string(inst.id) + " names a leader twice");
    p.instances.push_back(std::move(inst));
  }

  auto segments = cut_segments(p, in.selections);
  if (in.require_coverage) {
    if (!check_coverage(p, segments, why)) return fail(errc::invalid_argument);
  }
  std::erase_if(segments, [](const tensor_segment& s) { return s.audience == unclaimed; });

  // Pack each shard's segments into its own stream, audience by audience (in order of first
  // appearance), then cut each audience's run into chunks: a chunk never mixes audiences.
  std::vector<std::vector<chunk_info>> per_shard(in.shard_tensors.size());
  std::stable_sort(segments.begin(), segments.end(), [&](const tensor_segment& a, const tensor_segment& b) {
    return p.owner[a.tensor] < p.owner[b.tensor];
  });
  for (auto first = segments.begin(); first != segments.end();) {
    const auto shard = p.owner[first->tensor];
    const auto last = std::find_if(first, segments.end(), [&](const auto& s) { return p.owner[s.tensor] != shard; });
    std::vector<std::uint32_t> order;  // audiences by first appearance in the shard
    for (auto it = first; it != last; ++it) {
      if (std::find(order.begin(), order.end(), it->audience) == order.end()) order.push_back(it->audience);
    }
    std::stable_sort(first, last, [&](const tensor_segment& a, const tensor_segment& b) {
      return std::find(order.begin(), order.end(), a.audience) < std::find(order.begin(), order.end(), b.audience);
    });
    std::uint64_t stream = 0;
    for (auto run = first; run != last;) {
      const auto run_end = std::find_if(run, last, [&](const auto& s) { return s.audience != run->audience; });
      const std::uint64_t begin_run = align_up(stream);
      for (auto it = run; it != run_end; ++it) {
        it->shard_offset = stream = align_up(stream);
        stream += it->bytes;
      }
      auto piece_from = run;  // segments before it end before the current chunk
      for (std::uint64_t begin = begin_run; begin < stream; begin += in.chunk_bytes) {
        chunk_info c{.shard = shard, .shard_offset = begin, .bytes = std::min(in.chunk_bytes, stream - begin),
                     .audience = run->audience};
        const std::uint64_t end = begin + c.bytes;
        while (piece_from != run_end && piece_from->shard_offset + piece_from->bytes <= begin) ++piece_from;
        for (auto it = piece_from; it != run_end && it->shard_offset < end; ++it) {
          const std::uint64_t from = std::max(it->shard_offset, begin), to = std::min(it->shard_offset + it->bytes, end);
          if (from >= to) continue;
          c.pieces.push_back({.tensor = it->tensor, .tensor_offset = it->offset + (from - it->shard_offset),
                              .chunk_offset = from - begin, .bytes = to - from});
        }
        per_shard[shard].push_back(std::move(c));
      }
      run = run_end;
    }
    p.shard_bytes.resize(shard + 1, 0);
    p.shard_bytes[shard] = align_up(stream);
    first = last;
  }
  p.shard_bytes.resize(in.shard_tensors.size(), 0);
  p.segments = std::move(segments);

  // Interleave the shards so every sender works from the first chunk on.
  for (std::size_t round = 0;; ++round) {
    bool any = false;
    for (auto& chunks : per_shard) {
      if (round >= chunks.size()) continue;
      any = true;
      chunks[round].id = static_cast<std::uint32_t>(p.chunks.size());
      p.chunks.push_back(std::move(chunks[round]));
    }
    if (!any) break;
  }

  return p;
}

result<void> check_worker_tensors(std::span<const tensor_spec> published, std::span<const tensor_spec> worker,
                                  std::span<const byte_range> parts, std::vector<tensor_range>& selected,
                                  std::string& why) {
  selected.clear();
  if (worker.empty()) return {};  // the worker takes the trainers' table, whatever it is
  if (!validate_tensor_table(worker, why)) return fail(errc::invalid_argument);
  if (!parts.empty() && parts.size() != worker.size()) {
    why = "the worker registered " + std::to_string(parts.size()) + " ranges for " + std::to_string(worker.size()) +
          " tensors";
    return fail(errc::invalid_argument);
  }
  std::unordered_map<std::string_view, const tensor_spec*> theirs;
  for (const auto& t : published) theirs.emplace(t.name, &t);
  bool everything = worker.size() == published.size();
  for (std::size_t i = 0; i < worker.size(); ++i) {
    const auto& mine = worker[i];
    const auto it = theirs.find(mine.name);
    if (it == theirs.end()) {
      why = "the worker registered tensor '" + mine.name + "', which no trainer publishes";
      return fail(errc::invalid_argument);
    }
    const auto& t = *it->second;
    if (mine.type != t.type || mine.shape != t.shape) {
      why = "tensor '" + t.name + "' differs: trainer has " + std::string(dtype_name(t.type)) + " " +
            std::to_string(t.nbytes) + " bytes, worker has " + std::string(dtype_name(mine.type)) + " " +
            std::to_string(mine.nbytes) + " bytes (dtype or shape mismatch)";
      return fail(errc::invalid_argument);
    }
    const auto range = parts.empty() ? byte_range{0, t.nbytes} : parts[i];
    if (range.bytes == 0 || range.offset > t.nbytes || range.bytes > t.nbytes - range.offset) {
      why = "tensor '" + t.name + "': the worker registered bytes [" + std::to_string(range.offset) + ", " +
            std::to_string(range.offset + range.bytes) + "), which lie outside its " + std::to_string(t.nbytes) +
            " bytes";
      return fail(errc::invalid_argument);
    }
    everything = everything && range.bytes == t.nbytes;
    selected.push_back({t.name, range});
  }
  if (everything) selected.clear();
  return {};
}

std::vector<std::uint32_t> choose_leaders(const std::vector<address>& workers, std::uint32_t stripes, bool on_devices,
                                          std::optional<address> first_leader) {
  const auto size = static_cast<std::uint32_t>(workers.size());
  const std::uint32_t k = std::clamp(stripes != 0 ? stripes : (on_devices ? size : 1u), 1u, size);
  std::uint32_t first = 0;
  if (first_leader) {
    const auto at = std::find(workers.begin(), workers.end(), *first_leader);
    if (at != workers.end()) first = static_cast<std::uint32_t>(at - workers.begin());
  }
  std::vector<std::uint32_t> leaders{first};
  for (std::uint32_t r = 0; r < size && leaders.size() < k; ++r) {
    if (r != first) leaders.push_back(r);
  }
  return leaders;
}

}  // namespace ferry
