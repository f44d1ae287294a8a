#include "jobs/job_memory.hpp"

#include <fmt/format.h>

#include "actors/synthetic_model.hpp"
#include "platform/available_memory.hpp"

namespace ferry {

namespace {

/// A member's place: host memory, or GPU `gpu` of the one host, which reads no other GPU (so the
/// plan keeps host copies, the most host memory a job of these members can need).
device_place place_on(bool gpu, std::uint32_t index) {
  if (!gpu) return {};
  return {
      .host = 1, .gpu = "gpu" + std::to_string(index), .reads = {"gpu" + std::to_string(index)}};
}

double gib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / (1ull << 30);
}

}  // namespace

result<job_memory> expected_memory(std::span<const tensor_spec> model, const job_config& config,
                                   member_places places, std::string& why) {
  const std::vector<tensor_spec> table(model.begin(), model.end());
  plan_inputs in{.chunk_bytes = config.chunk_bytes,
                 .depth = config.depth,
                 .shared_host_copies = config.shared_host_copies,
                 .p2p = config.p2p};
  node_id next = 1;
  std::uint32_t gpu = 0;
  for (auto& shard : split_over_shards(table, config.trainers)) {
    in.shards.push_back({next++, 1});
    in.shard_tensors.push_back(std::move(shard));
    in.shard_places.push_back(place_on(places.trainers_on_gpus, gpu++));
  }
  const published_tensors published(table);
  for (std::uint32_t i = 0; i < config.instances; ++i) {
    instance_plan inst{.id = i};
    for (std::uint32_t r = 0; r < config.workers_per_instance; ++r) {
      const address who{next++, 1};
      inst.workers.push_back(who);
      inst.places.push_back(place_on(places.workers_on_gpus, gpu++));
      if (config.shard_rollout == rollout_sharding::none) continue;
      std::vector<tensor_spec> specs;
      std::vector<byte_range> parts;
      for (const auto& t :
           rollout_share(table, config.shard_rollout, r, config.workers_per_instance)) {
        specs.push_back(t.spec);
        parts.push_back(t.held());
      }
      selection s;
      if (!check_worker_tensors(published, specs, parts, s, why))
        return fail(errc::invalid_argument);
      if (!s.empty()) in.select(who, std::move(s));
    }
    inst.leaders =
        choose_leaders(inst.workers, config.stripes, places.workers_on_gpus, std::nullopt);
    in.instances.push_back(std::move(inst));
  }
  auto p = make_plan(in, why);
  if (!p) return std::unexpected(p.error());
  return memory_of(*p);
}

std::optional<std::string> refuse_beyond_host(std::span<const tensor_spec> model,
                                              const job_config& config, member_places places) {
  std::string why;
  const auto need = expected_memory(model, config, places, why);
  const auto available = available_host_memory();
  if (!need || !available || need->all.host <= *available) return std::nullopt;
  return fmt::format(
      "the job needs {:.1f} GiB of host memory (each trainer shard up to {:.1f} GiB, "
      "each leader {:.1f}, each follower {:.1f}), and this host has {:.1f} GiB available",
      gib(need->all.host), gib(need->trainer.host), gib(need->leader.host),
      gib(need->follower.host), gib(*available));
}

}  // namespace ferry
