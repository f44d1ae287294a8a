#include "actors/member_memory.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "collectives/broadcast.hpp"

namespace ferry {

namespace {

/// Per audience, the bytes of its chunks (0: it has none).
std::vector<std::uint64_t> audience_bytes(const plan& job) {
  std::vector<std::uint64_t> bytes(job.audiences.size(), 0);
  for (const auto& c : job.chunks) bytes[c.audience] += c.bytes;
  return bytes;
}

/// `bytes` in the unit that reads best: "1.50 GiB", "12.0 MiB", "4096 bytes".
std::string size_text(std::uint64_t bytes) {
  const auto in = [bytes](unsigned shift) {
    return static_cast<double>(bytes) / static_cast<double>(1ull << shift);
  };
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", in(30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", in(20));
  return fmt::format("{} bytes", bytes);
}

const device_place& place_of(const instance_plan& inst, std::size_t rank) {
  static const device_place host;
  return inst.places.empty() ? host : inst.places[rank];
}

member_memory worker_memory(const plan& job, const instance_plan& inst, std::size_t rank,
                            const std::vector<std::uint64_t>& by_audience) {
  const auto& worker = inst.workers[rank];
  std::uint64_t received = 0;
  bool hears_directly = false;
  for (std::uint32_t a = 0; a < by_audience.size(); ++a) {
    if (by_audience[a] == 0 || !job.hears(a, worker)) continue;
    received += by_audience[a];
    hears_directly = hears_directly || !job.whole_instance(inst, a);
  }
  const auto& place = place_of(inst, rank);
  const auto slots = worker_slots::of(
      job,
      {.leader = std::find(inst.leaders.begin(), inst.leaders.end(), rank) != inst.leaders.end(),
       .stripes = static_cast<std::uint32_t>(std::max<std::size_t>(inst.leaders.size(), 1)),
       .on_device = !place.gpu.empty(),
       .rdma = place.rdma,
       .hears_directly = hears_directly});
  member_memory m;
  (place.gpu.empty() ? m.host : m.device) += received;
  (slots.receive_on_device ? m.device : m.host) += slots.receive_bytes(job.chunk_bytes);
  m.device += std::uint64_t{slots.broadcast} * job.chunk_bytes;
  return m;
}

}  // namespace

worker_slots worker_slots::of(const plan& job, const worker_role& role) {
  worker_slots s;
  s.first_direct = role.leader ? static_cast<std::uint32_t>(job.shards.size()) * job.depth
                               : (role.on_device ? 0 : job.depth);
  s.direct = role.hears_directly ? direct_count(job.depth) : 0;
  s.broadcast = role.on_device ? job.depth : 0;
  s.receive_on_device = role.on_device && role.rdma && job.p2p != p2p_mode::host;
  // A leader of several on a GPU copies its stripe into a broadcast slot, where the instance
  // gathers the chunk: its receive slots (in host memory, or on the GPU) need hold no more.
  const bool uploads_stripe = role.leader && role.on_device && role.stripes > 1;
  s.slot_bytes =
      uploads_stripe ? stripe_of(job.chunk_bytes, role.stripes, 0).bytes : job.chunk_bytes;
  return s;
}

member_memory shard_memory(const plan& job, std::uint32_t shard) {
  member_memory m;
  std::uint64_t tensors = 0;
  for (std::size_t i = 0; i < job.tensors.size(); ++i) {
    if (job.owner[i] == shard) tensors += job.tensors[i].nbytes;
  }
  const bool on_device = shard < job.shard_places.size() && !job.shard_places[shard].gpu.empty();
  (on_device ? m.device : m.host) += tensors;
  // Two copies, one per version parity (shard_copies).
  const auto kept = job.copies_of(shard);
  if (kept.host) m.host += 2 * job.shard_bytes[shard];
  if (kept.device) m.device += 2 * job.shard_bytes[shard];
  return m;
}

member_memory worker_memory(const plan& job, const instance_plan& inst, std::size_t rank) {
  return worker_memory(job, inst, rank, audience_bytes(job));
}

std::optional<std::string> beyond_host(platform& host, std::uint64_t bytes, std::string_view what) {
  const auto available = host.available_host_memory();
  if (!available || bytes <= *available) return std::nullopt;
  return fmt::format("{} need {} of host memory, and this host has {} available", what,
                     size_text(bytes), size_text(*available));
}

job_memory memory_of(const plan& job,
                     const std::function<void(const address&, const member_memory&)>& each) {
  const auto most = [](member_memory& into, const member_memory& m) {
    into.host = std::max(into.host, m.host);
    into.device = std::max(into.device, m.device);
  };
  job_memory j;
  for (std::uint32_t s = 0; s < job.shards.size(); ++s) {
    const auto m = shard_memory(job, s);
    most(j.trainer, m);
    j.all += m;
    if (each) each(job.shards[s], m);
  }
  const auto by_audience = audience_bytes(job);
  for (const auto& inst : job.instances) {
    for (std::size_t r = 0; r < inst.workers.size(); ++r) {
      const auto m = worker_memory(job, inst, r, by_audience);
      const bool leader =
          std::find(inst.leaders.begin(), inst.leaders.end(), r) != inst.leaders.end();
      most(leader ? j.leader : j.follower, m);
      j.all += m;
      if (each) each(inst.workers[r], m);
    }
  }
  return j;
}

}  // namespace ferry
