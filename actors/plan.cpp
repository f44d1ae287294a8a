#include "actors/plan.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

#include "actors/plan_digest.hpp"
#include "runtime/shared_per_sources.hpp"

namespace ferry {

std::uint64_t plan::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.bytes;
  return n;
}

std::vector<std::uint32_t> plan::chunks_of(std::uint32_t shard) const {
  std::vector<std::uint32_t> ids;
  std::map<std::uint32_t, std::uint32_t> per_audience;
  for (const auto& c : chunks) {
    if (c.shard != shard) continue;
    ids.push_back(c.id);
    ++per_audience[c.audience];
  }
  // Packing groups a shard's chunks by audience; sending them so would hold back the workers whose
  // chunks come last until the offload reaches them. Each audience's chunks are spread evenly
  // over the order instead (the k-th of n at (k + 1/2) / n), keeping their own order.
  std::vector<double> at(chunks.size());
  std::map<std::uint32_t, std::uint32_t> seen;
  for (const auto id : ids) {
    const auto a = chunks[id].audience;
    at[id] = (seen[a]++ + 0.5) / per_audience[a];
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](std::uint32_t x, std::uint32_t y) { return at[x] < at[y]; });
  return ids;
}

std::string_view p2p_mode_name(p2p_mode mode) {
  switch (mode) {
    case p2p_mode::device:
      return "device";
    case p2p_mode::host:
      return "host";
    default:
      return "auto";
  }
}

std::optional<p2p_mode> parse_p2p_mode(std::string_view name) {
  for (auto mode : {p2p_mode::automatic, p2p_mode::device, p2p_mode::host})
    if (name == p2p_mode_name(mode)) return mode;
  return std::nullopt;
}

chunk_path path_between(p2p_mode mode, const device_place& shard, const device_place& worker) {
  if (mode == p2p_mode::host || shard.gpu.empty() || worker.gpu.empty())
    return chunk_path::host_copy;
  const bool one_host = shard.host != 0 && shard.host == worker.host;
  const bool reads = shard.gpu == worker.gpu || std::find(worker.reads.begin(), worker.reads.end(),
                                                          shard.gpu) != worker.reads.end();
  if (one_host && (reads || mode == p2p_mode::device)) return chunk_path::device_direct;
  return shard.rdma && worker.rdma ? chunk_path::gpudirect : chunk_path::host_copy;
}

chunk_path plan::path(std::uint32_t shard, const instance_plan& inst, std::size_t rank) const {
  if (shard >= shard_places.size() || rank >= inst.places.size()) return chunk_path::host_copy;
  return path_between(p2p, shard_places[shard], inst.places[rank]);
}

plan::shard_copies plan::copies_of(std::uint32_t shard) const {
  shard_copies kept;
  for (const auto& inst : instances) {
    for (std::size_t r = 0; r < inst.workers.size(); ++r) {
      const auto p = path(shard, inst, r);
      (p == chunk_path::host_copy ? kept.host : kept.device) = true;
      kept.device_written = kept.device_written || p == chunk_path::gpudirect;
    }
  }
  return kept;
}

plan::pair_count plan::paths() const {
  pair_count n;
  for (std::uint32_t s = 0; s < shards.size(); ++s) {
    for (const auto& inst : instances) {
      for (std::size_t r = 0; r < inst.workers.size(); ++r) {
        ++n.all;
        const auto p = path(s, inst, r);
        n.device_direct += p == chunk_path::device_direct;
        n.gpudirect += p == chunk_path::gpudirect;
      }
    }
  }
  return n;
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

plan::receive_share plan::receive_shares() const {
  std::vector<std::uint64_t> sent_bytes(audiences.size(), 0), segment_bytes(audiences.size(), 0);
  for (const auto& c : chunks) sent_bytes[c.audience] += c.bytes;
  for (const auto& s : segments) segment_bytes[s.audience] += s.bytes;
  receive_share share;
  for (const auto& inst : instances) {
    for (const auto& w : inst.workers) {
      std::uint64_t receives = 0, holds = 0;
      for (std::uint32_t a = 0; a < audiences.size(); ++a) {
        if (!hears(a, w)) continue;
        receives += sent_bytes[a];
        holds += segment_bytes[a];
      }
      share.most_bytes = std::max(share.most_bytes, receives);
      share.worst_ratio = std::max(
          share.worst_ratio, static_cast<double>(receives) / std::max<std::uint64_t>(holds, 1));
    }
  }
  return share;
}

std::shared_ptr<const plan> share_plan(const plan& p) {
  if (p.digest == 0) return std::make_shared<const plan>(p);  // not made by make_plan: not shared
  static std::mutex mutex;
  static std::unordered_map<std::uint64_t, std::weak_ptr<const plan>> shared;
  std::lock_guard lock(mutex);
  std::erase_if(shared, [](const auto& e) { return e.second.expired(); });
  auto& slot = shared[p.digest];
  if (auto live = slot.lock(); live && live->digest == p.digest && live->epoch == p.epoch)
    return live;
  auto copy = std::make_shared<const plan>(p);
  slot = copy;
  return copy;
}

std::optional<std::string> chunk_bytes_refusal(std::uint64_t chunk_bytes) {
  if (chunk_bytes >= tensor_alignment && chunk_bytes % tensor_alignment == 0) return std::nullopt;
  return "must be a positive multiple of the " + std::to_string(tensor_alignment) +
         "-byte alignment";
}

std::optional<std::string> depth_refusal(std::uint32_t depth) {
  if (depth >= 1) return std::nullopt;
  return "depth must be at least 1";
}

namespace {
std::uint64_t align_up(std::uint64_t n) {
  return (n + tensor_alignment - 1) / tensor_alignment * tensor_alignment;
}

std::string bytes_of(const tensor_segment& s, const plan& p) {
  return "bytes [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.bytes) +
         ") of tensor '" + p.tensors[s.tensor].name + "'";
}

/// Each tensor cut where a selection's range starts or ends. A segment's key is the selections
/// that cover it, its audience every live worker that hears all of it: those without a selection,
/// and those whose selection is in the key. Audiences are interned into `p.audiences`.
struct segment_cut {
  std::vector<tensor_segment> segments;
  std::vector<std::uint32_t> key_of;  ///< per segment: its key, numbered by first appearance
};
segment_cut cut_segments(plan& p, const selection_set& selections,
                         const std::map<address, shared_selection>& selected) {
  const std::vector<shared_selection> known(selections.begin(), selections.end());
  std::map<const selection*, std::uint32_t> number;  // by identity: no contents compared
  for (std::uint32_t k = 0; k < known.size(); ++k) number.emplace(known[k].get(), k);
  auto number_of = [&](const shared_selection& s) {
    const auto it = number.find(s.get());
    if (it == number.end())
      throw std::logic_error(
          "plan_inputs: a selected entry is not one of `selections` (use select)");
    return it->second;
  };
  std::vector<address> whole;                               // live workers without a selection
  std::vector<std::vector<address>> holders(known.size());  // per selection, its live workers
  for (const auto& inst : p.instances) {
    for (const auto& w : inst.workers) {
      const auto it = selected.find(w);
      if (it == selected.end()) {
        whole.push_back(w);
      } else {
        holders[number_of(it->second)].push_back(w);
      }
    }
  }
  std::unordered_map<std::string_view, std::vector<std::pair<std::uint32_t, byte_range>>> wants;
  for (std::uint32_t k = 0; k < known.size(); ++k) {
    for (const auto& r : *known[k]) wants[r.name].emplace_back(k, r.range);
  }
  segment_cut out;
  std::map<std::vector<std::uint32_t>, std::pair<std::uint32_t, std::uint32_t>>
      keys;  // -> key, audience
  std::map<std::vector<address>, std::uint32_t> interned;
  auto audience_of = [&](std::vector<address> who) {
    std::sort(who.begin(), who.end());
    const auto [it, fresh] = interned.emplace(who, static_cast<std::uint32_t>(p.audiences.size()));
    if (fresh) p.audiences.push_back(std::move(who));
    return it->second;
  };
  auto add = [&](std::uint32_t tensor, std::uint64_t offset, std::uint64_t bytes,
                 std::vector<std::uint32_t> covering) {
    auto [it, fresh] =
        keys.emplace(covering, std::pair{static_cast<std::uint32_t>(keys.size()), 0u});
    if (fresh) {
      if (covering.size() == known.size()) {
        it->second.second = 0;  // every selection, and the workers without one: everyone
      } else {
        std::vector<address> who = whole;
        for (const auto k : covering) who.insert(who.end(), holders[k].begin(), holders[k].end());
        it->second.second = audience_of(std::move(who));
      }
    }
    out.segments.push_back(
        {.tensor = tensor, .offset = offset, .bytes = bytes, .audience = it->second.second});
    out.key_of.push_back(it->second.first);
  };
  out.segments.reserve(p.tensors.size());
  for (std::uint32_t i = 0; i < p.tensors.size(); ++i) {
    const auto nbytes = p.tensors[i].nbytes;
    const auto it = wants.find(p.tensors[i].name);
    if (it == wants.end()) {
      add(i, 0, nbytes, {});
      continue;
    }
    std::vector<std::uint64_t> cuts{0, nbytes};
    for (const auto& [k, r] : it->second) {
      cuts.push_back(std::min(r.offset, nbytes));
      cuts.push_back(std::min(r.end(), nbytes));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      std::vector<std::uint32_t> covering;
      for (const auto& [k, r] : it->second) {
        if (r.offset <= cuts[c] && r.end() >= cuts[c + 1]) covering.push_back(k);
      }
      add(i, cuts[c], cuts[c + 1] - cuts[c], std::move(covering));
    }
  }
  return out;
}

/// Places `run` (segments of one shard and one key) in the shard's stream from `stream` on, each
/// 256-byte aligned, and cuts it into chunks of at most `chunk_bytes` that no other run shares.
void pack_run(std::span<tensor_segment> run, std::uint32_t shard, std::uint64_t chunk_bytes,
              std::uint64_t& stream, std::vector<chunk_info>& chunks) {
  const std::uint64_t first_byte = align_up(stream);
  for (auto& s : run) {
    s.shard_offset = stream = align_up(stream);
    stream += s.bytes;
  }
  auto next = run.begin();  // the segments before it end before the current chunk
  for (std::uint64_t begin = first_byte; begin < stream; begin += chunk_bytes) {
    chunk_info c{.shard = shard,
                 .shard_offset = begin,
                 .bytes = std::min(chunk_bytes, stream - begin),
                 .audience = run.front().audience};
    const std::uint64_t end = begin + c.bytes;
    while (next != run.end() && next->shard_offset + next->bytes <= begin) ++next;
    for (auto it = next; it != run.end() && it->shard_offset < end; ++it) {
      const std::uint64_t from = std::max(it->shard_offset, begin),
                          to = std::min(it->shard_offset + it->bytes, end);
      if (from >= to) continue;
      c.pieces.push_back({.tensor = it->tensor,
                          .tensor_offset = it->offset + (from - it->shard_offset),
                          .chunk_offset = from - begin,
                          .bytes = to - from});
    }
    chunks.push_back(std::move(c));
  }
}

/// Every segment has a hearer in every instance.
result<void> check_coverage(const plan& p, const segment_cut& c, std::string& why) {
  for (const auto& inst : p.instances) {
    std::map<std::uint32_t, bool> heard;  // audience -> some member of `inst` hears it
    for (const auto& s : c.segments) {
      if (s.audience != 0 && p.audiences[s.audience].empty()) {
        why = "no worker registered " + bytes_of(s, p) +
              " (every instance must hold the whole model)";
        return fail(errc::invalid_argument);
      }
      auto [it, fresh] = heard.emplace(s.audience, false);
      if (fresh) it->second = !p.hearers(inst, s.audience).empty();
      if (!it->second) {
        why = "instance " + std::to_string(inst.id) + " leaves " + bytes_of(s, p) +
              " unclaimed: none of its " + std::to_string(inst.workers.size()) +
              " worker(s) registered them";
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
    why = "max_regions_per_peer: node " + std::to_string(peer) + " offered " +
          std::to_string(o.ids.size() + 1) + " regions in epoch " + std::to_string(epoch) +
          ", the limit is " + std::to_string(limits.max_regions_per_peer);
    return fail(errc::invalid_argument);
  }
  o.ids.insert(region.id);
  return {};
}

namespace {

/// `reason` in `why`, and the error make_plan returns with it.
std::unexpected<std::error_code> refuse(std::string& why, std::string reason) {
  why = std::move(reason);
  return fail(errc::invalid_argument);
}

/// Refuses inputs no plan can be made of, and from sizes alone (nothing is allocated yet) inputs
/// that would break a limit.
result<void> check_plan_inputs(const plan_inputs& in, std::string& why) {
  if (auto no = chunk_bytes_refusal(in.chunk_bytes))
    return refuse(why, "chunk size " + std::to_string(in.chunk_bytes) + ": " + *no);
  if (auto no = depth_refusal(in.depth)) return refuse(why, *no);
  if (in.shard_tensors.empty() || in.shard_tensors.size() != in.shards.size()) {
    return refuse(why, "a plan needs at least one trainer shard");
  }
  if (in.instances.empty()) return refuse(why, "a plan needs at least one rollout instance");
  if (!in.shard_places.empty() && in.shard_places.size() != in.shards.size())
    return refuse(why, "a plan needs a place for every trainer shard, or none");
  for (const auto& inst : in.instances) {
    if (!inst.places.empty() && inst.places.size() != inst.workers.size())
      return refuse(
          why, "instance " + std::to_string(inst.id) + " needs a place for every worker, or none");
  }

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
    return refuse(why, "max_tensors: the plan has " + std::to_string(tensor_count) +
                           " tensors, the limit is " + std::to_string(in.limits.max_tensors));
  }
  if (chunk_count > in.limits.max_chunks) {
    return refuse(why, "max_chunks: the plan needs " + std::to_string(chunk_count) + " chunks of " +
                           std::to_string(in.chunk_bytes) + " bytes, the limit is " +
                           std::to_string(in.limits.max_chunks));
  }

  return {};
}

/// Packs each shard's segments into its own stream, key by key (by first appearance), then cuts
/// each key's run into chunks: a chunk never mixes keys, so it has one audience. Segments with no
/// hearer stay in the layout (a replacement may hear them again) and go nowhere. The shards'
/// chunks are interleaved so every sender works from the first chunk on.
void pack_chunks(plan& p, const segment_cut& cut, std::size_t shards, std::uint64_t chunk_bytes) {
  std::vector<std::vector<chunk_info>> per_shard(shards);
  std::vector<std::uint32_t> order(cut.segments.size());  // segments in packing order
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::pair(p.owner[cut.segments[a].tensor], cut.key_of[a]) <
           std::pair(p.owner[cut.segments[b].tensor], cut.key_of[b]);
  });
  std::vector<tensor_segment> segments;
  std::vector<std::uint32_t> key_of;
  for (const auto i : order) {
    segments.push_back(cut.segments[i]);
    key_of.push_back(cut.key_of[i]);
  }
  p.shard_bytes.assign(shards, 0);
  for (std::size_t first = 0; first < segments.size();) {
    const auto shard = p.owner[segments[first].tensor];
    auto run_end = [&](std::size_t i) {  // the end of the run of `i`'s shard and key
      std::size_t end = i;
      while (end < segments.size() && p.owner[segments[end].tensor] == shard &&
             key_of[end] == key_of[i])
        ++end;
      return end;
    };
    std::uint64_t stream = 0;
    std::size_t run = first;
    for (; run < segments.size() && p.owner[segments[run].tensor] == shard; run = run_end(run)) {
      pack_run(std::span(segments).subspan(run, run_end(run) - run), shard, chunk_bytes, stream,
               per_shard[shard]);
    }
    p.shard_bytes[shard] = align_up(stream);
    first = run;
  }
  p.segments = std::move(segments);

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
}

}  // namespace

result<plan> make_plan(const plan_inputs& in, std::string& why) {
  if (!check_plan_inputs(in, why)) return fail(errc::invalid_argument);
  plan p;
  p.epoch = in.epoch;
  p.chunk_bytes = in.chunk_bytes;
  p.depth = in.depth;
  p.shared_host_copies = in.shared_host_copies;
  p.p2p = in.p2p;
  p.shard_places = in.shard_places;
  p.shards = in.shards;
  std::unordered_map<std::string_view, std::uint32_t> owner_of;  // views into `in`'s tables
  std::size_t tensors = 0;
  for (const auto& table : in.shard_tensors) tensors += table.size();
  owner_of.reserve(tensors);
  p.tensors.reserve(tensors);
  p.owner.reserve(tensors);
  for (std::uint32_t s = 0; s < in.shard_tensors.size(); ++s) {
    const auto& table = in.shard_tensors[s];
    if (!validate_tensor_table(table, why)) return fail(errc::invalid_argument);
    for (const auto& t : table) {
      if (auto [it, fresh] = owner_of.emplace(t.name, s); !fresh) {
        return refuse(why, "tensor '" + t.name + "' is owned by shards " +
                               std::to_string(it->second) + " and " + std::to_string(s));
      }
      p.tensors.push_back(t);
      p.owner.push_back(s);
    }
  }
  for (auto inst : in.instances) {
    if (inst.workers.empty())
      return refuse(why, "instance " + std::to_string(inst.id) + " has no workers");
    if (inst.leaders.empty()) inst.leaders = {0};
    for (auto l : inst.leaders) {
      if (l >= inst.workers.size())
        return refuse(why,
                      "instance " + std::to_string(inst.id) + " names a leader rank past its size");
    }
    if (std::set(inst.leaders.begin(), inst.leaders.end()).size() != inst.leaders.size())
      return refuse(why, "instance " + std::to_string(inst.id) + " names a leader twice");
    p.instances.push_back(std::move(inst));
  }

  auto cut = cut_segments(p, in.selections, in.selected);
  if (in.require_coverage && !check_coverage(p, cut, why)) return fail(errc::invalid_argument);

  pack_chunks(p, cut, in.shard_tensors.size(), in.chunk_bytes);
  p.layout = layout_digest(p);
  p.digest = plan_digest(p);
  return p;
}

published_tensors::published_tensors(std::span<const tensor_spec> all) : size_(all.size()) {
  by_name_.reserve(all.size());
  for (const auto& t : all) by_name_.emplace(t.name, &t);
}

const tensor_spec* published_tensors::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

plan_index::plan_index(std::shared_ptr<const plan> job)
    : job_(std::move(job)), by_name_(job_->tensors) {
  const auto audiences = job_->audiences.size();
  const auto past = [&](std::string what, std::uint32_t audience) {
    if (flaw_.empty()) {
      flaw_ = "has " + what + " in audience " + std::to_string(audience) + ", past its " +
              std::to_string(audiences);
    }
  };
  for (std::uint32_t i = 0; i < job_->chunks.size(); ++i) {
    const auto& c = job_->chunks[i];
    if (c.id != i && flaw_.empty())
      flaw_ = "has chunk " + std::to_string(c.id) + " in place " + std::to_string(i);
    if (c.audience >= audiences) past("chunk " + std::to_string(i), c.audience);
  }
  first_segment_.assign(audiences + 1, 0);
  for (std::uint32_t i = 0; i < job_->segments.size(); ++i) {
    const auto a = job_->segments[i].audience;
    if (a < audiences)
      ++first_segment_[a + 1];
    else
      past("segment " + std::to_string(i), a);
  }
  for (std::size_t a = 1; a < first_segment_.size(); ++a)
    first_segment_[a] += first_segment_[a - 1];
  segments_.resize(first_segment_.back());
  auto next = first_segment_;
  for (std::uint32_t i = 0; i < job_->segments.size(); ++i) {
    if (const auto a = job_->segments[i].audience; a < audiences) segments_[next[a]++] = i;
  }
}

std::shared_ptr<const plan_index> plan_index::of(const std::shared_ptr<const plan>& job) {
  return shared_per_sources<plan_index>([&] { return std::make_shared<const plan_index>(job); },
                                        job);
}

std::int64_t plan_index::tensor_named(std::string_view name) const {
  const auto* t = by_name_.find(name);
  return t ? t - job_->tensors.data() : -1;
}

result<void> check_worker_tensors(const published_tensors& published,
                                  std::span<const tensor_spec> worker,
                                  std::span<const byte_range> parts, selection& selected,
                                  std::string& why) {
  selected.clear();
  if (worker.empty()) return {};  // the worker takes the trainers' table, whatever it is
  if (!validate_tensor_table(worker, why)) return fail(errc::invalid_argument);
  if (!parts.empty() && parts.size() != worker.size()) {
    why = "the worker registered " + std::to_string(parts.size()) + " ranges for " +
          std::to_string(worker.size()) + " tensors";
    return fail(errc::invalid_argument);
  }
  bool everything = worker.size() == published.size();
  for (std::size_t i = 0; i < worker.size(); ++i) {
    const auto& mine = worker[i];
    const auto* theirs = published.find(mine.name);
    if (!theirs) {
      why = "the worker registered tensor '" + mine.name + "', which no trainer publishes";
      return fail(errc::invalid_argument);
    }
    const auto& t = *theirs;
    if (mine.type != t.type || mine.shape != t.shape) {
      why = "tensor '" + t.name + "' differs: trainer has " + std::string(dtype_name(t.type)) +
            " " + std::to_string(t.nbytes) + " bytes, worker has " +
            std::string(dtype_name(mine.type)) + " " + std::to_string(mine.nbytes) +
            " bytes (dtype or shape mismatch)";
      return fail(errc::invalid_argument);
    }
    const auto range = parts.empty() ? byte_range{0, t.nbytes} : parts[i];
    if (range.bytes == 0 || range.offset > t.nbytes || range.bytes > t.nbytes - range.offset) {
      why = "tensor '" + t.name + "': the worker registered bytes [" +
            std::to_string(range.offset) + ", " + std::to_string(range.offset + range.bytes) +
            "), which lie outside its " + std::to_string(t.nbytes) + " bytes";
      return fail(errc::invalid_argument);
    }
    everything = everything && range.bytes == t.nbytes;
    selected.push_back({t.name, range});
  }
  if (everything) selected.clear();
  std::sort(selected.begin(), selected.end());
  return {};
}

std::vector<std::uint32_t> choose_leaders(const std::vector<address>& workers,
                                          std::uint32_t stripes, bool on_devices,
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
