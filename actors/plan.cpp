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

namespace {
std::uint64_t align_up(std::uint64_t n) { return (n + tensor_alignment - 1) / tensor_alignment * tensor_alignment; }
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

  // Pack each shard's tensors into its own stream, then cut the stream into chunks.
  std::vector<std::vector<chunk_info>> per_shard(in.shard_tensors.size());
  std::map<std::string, std::uint32_t> owner_of;
  for (std::uint32_t s = 0; s < in.shard_tensors.size(); ++s) {
    const auto& table = in.shard_tensors[s];
    if (!validate_tensor_table(table, why)) return fail(errc::invalid_argument);
    std::uint64_t stream = 0;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> placed;  // tensor index, stream offset
    for (const auto& t : table) {
      if (auto [it, fresh] = owner_of.emplace(t.name, s); !fresh) {
        return refuse("tensor '" + t.name + "' is owned by shards " + std::to_string(it->second) + " and " +
                      std::to_string(s));
      }
      const auto index = static_cast<std::uint32_t>(p.tensors.size());
      p.tensors.push_back(t);
      p.owner.push_back(s);
      stream = align_up(stream);
      placed.emplace_back(index, stream);
      stream += t.nbytes;
    }
    p.shard_bytes.push_back(align_up(stream));
    for (std::uint64_t begin = 0; begin < stream; begin += in.chunk_bytes) {
      chunk_info c{.shard = s, .shard_offset = begin, .bytes = std::min(in.chunk_bytes, stream - begin)};
      const std::uint64_t end = begin + c.bytes;
      for (const auto& [index, offset] : placed) {
        const std::uint64_t t_end = offset + p.tensors[index].nbytes;
        if (t_end <= begin || offset >= end) continue;
        const std::uint64_t from = std::max(offset, begin), to = std::min(t_end, end);
        c.pieces.push_back({.tensor = index, .tensor_offset = from - offset, .chunk_offset = from - begin,
                            .bytes = to - from});
      }
      per_shard[s].push_back(std::move(c));
    }
  }

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
  return p;
}

result<void> check_worker_tensors(const plan& p, std::span<const tensor_spec> worker, std::string& why) {
  if (worker.empty()) return {};  // the worker takes the trainers' table, whatever it is
  if (!validate_tensor_table(worker, why)) return fail(errc::invalid_argument);
  std::map<std::string, const tensor_spec*> mine;
  for (const auto& t : worker) mine[t.name] = &t;
  for (const auto& t : p.tensors) {
    auto it = mine.find(t.name);
    if (it == mine.end()) {
      why = "the trainers publish tensor '" + t.name + "' but the worker did not register it";
      return fail(errc::invalid_argument);
    }
    if (it->second->type != t.type || it->second->shape != t.shape) {
      why = "tensor '" + t.name + "' differs: trainer has " + std::string(dtype_name(t.type)) + " " +
            std::to_string(t.nbytes) + " bytes, worker has " + std::string(dtype_name(it->second->type)) + " " +
            std::to_string(it->second->nbytes) + " bytes (dtype or shape mismatch)";
      return fail(errc::invalid_argument);
    }
    mine.erase(it);
  }
  if (!mine.empty()) {
    why = "the worker registered tensor '" + mine.begin()->first + "', which no trainer publishes";
    return fail(errc::invalid_argument);
  }
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
