#include "actors/member_memory.hpp"

#include <gtest/gtest.h>

#include "actors/synthetic_model.hpp"
#include "collectives/broadcast.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t chunk = 1 << 20;

/// Two trainer shards of `model`, and one instance of three workers: on GPUs of one host that
/// read only their own memory (so the trainers keep host copies), or in host memory.
plan plan_of(const std::vector<tensor_spec>& model, bool on_gpus) {
  plan_inputs in{.chunk_bytes = chunk, .depth = 3};
  const auto shards = split_over_shards(model, 2);
  for (std::uint32_t s = 0; s < 2; ++s) {
    in.shards.push_back({s + 1, 1});
    in.shard_tensors.push_back(shards[s]);
  }
  instance_plan inst{.id = 0, .workers = {{10, 1}, {11, 1}, {12, 1}}, .leaders = {0}};
  if (on_gpus) {
    for (int g = 0; g < 3; ++g) {
      const auto gpu = "gpu" + std::to_string(g);
      inst.places.push_back({.host = 1, .gpu = gpu, .reads = {gpu}});
    }
  }
  in.instances.push_back(inst);
  std::string why;
  auto p = make_plan(in, why);
  EXPECT_TRUE(p) << why;
  return std::move(*p);
}

std::uint64_t owned_by(const plan& p, std::uint32_t shard) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < p.tensors.size(); ++i)
    n += p.owner[i] == shard ? p.tensors[i].nbytes : 0;
  return n;
}

TEST(member_memory, counts_tensors_both_host_copies_and_each_role_s_slots) {
  const auto p = plan_of(synthetic_transformer(16 << 20), false);
  for (std::uint32_t s = 0; s < 2; ++s) {
    const auto m = shard_memory(p, s);
    EXPECT_EQ(m.host, owned_by(p, s) + 2 * p.shard_bytes[s]);
    EXPECT_EQ(m.device, 0u);
  }
  const auto& inst = p.instances[0];
  const auto everything = p.total_bytes();
  // A leader has depth receive slots per trainer shard; a host follower depth broadcast slots.
  EXPECT_EQ(worker_memory(p, inst, 0).host, everything + 2 * 3 * chunk);
  EXPECT_EQ(worker_memory(p, inst, 1).host, everything + 3 * chunk);
  const auto all = memory_of(p);
  EXPECT_EQ(all.leader.host, everything + 6 * chunk);
  EXPECT_EQ(all.follower.host, everything + 3 * chunk);
  EXPECT_EQ(all.all.host,
            shard_memory(p, 0).host + shard_memory(p, 1).host + 3 * everything + 12 * chunk);
}

TEST(member_memory, workers_on_gpus_hold_their_tensors_and_broadcast_slots_there) {
  const auto p = plan_of(synthetic_transformer(16 << 20), true);
  const auto& inst = p.instances[0];
  const auto everything = p.total_bytes();
  const auto leader = worker_memory(p, inst, 0), follower = worker_memory(p, inst, 1);
  EXPECT_EQ(leader.device, everything + 3 * chunk);
  EXPECT_EQ(leader.host, 2 * 3 * chunk);  // no GPUDirect: the trainers write into host memory
  EXPECT_EQ(follower.device, everything + 3 * chunk);
  EXPECT_EQ(follower.host, 0u);
}

TEST(member_memory, a_worker_with_rdma_receives_on_its_gpu) {
  const auto p = plan_of(synthetic_transformer(4 << 20), true);
  const auto slots =
      worker_slots::of(p, {.leader = true, .stripes = 1, .on_device = true, .rdma = true});
  EXPECT_TRUE(slots.receive_on_device);
  EXPECT_EQ(slots.receive(), 2u * 3);
  EXPECT_EQ(slots.slot_bytes, chunk)
      << "a lone leader broadcasts from its receive slots: whole chunks";
  const auto striped =
      worker_slots::of(p, {.leader = true, .stripes = 3, .on_device = true, .rdma = true});
  EXPECT_EQ(striped.slot_bytes, stripe_of(chunk, 3, 0).bytes)
      << "one of three copies its stripe out to gather";
  const auto follower = worker_slots::of(p, {.hears_directly = true});
  EXPECT_EQ(follower.receive(), 3u + worker_slots::direct_count(3));
  EXPECT_EQ(follower.receive_bytes(chunk), follower.receive() * chunk);
}

TEST(member_memory, a_gpu_leader_receiving_in_host_memory_keeps_just_its_stripe_per_slot) {
  const auto p = plan_of(synthetic_transformer(4 << 20), true);
  const auto slots = worker_slots::of(
      p, {.leader = true, .stripes = 4, .on_device = true, .hears_directly = true});
  EXPECT_FALSE(slots.receive_on_device);
  EXPECT_EQ(slots.slot_bytes, chunk / 4);
  EXPECT_TRUE(worker_slots::stripe_only(slots.slot_bytes, chunk));
  EXPECT_EQ(slots.receive_bytes(chunk),
            2 * 3 * (chunk / 4) + worker_slots::direct_count(3) * chunk);
  // The direct slots, of whole chunks, follow the stripe slots.
  EXPECT_EQ(worker_slots::offset_of(5, slots.first_direct, slots.slot_bytes, chunk),
            5 * (chunk / 4));
  EXPECT_EQ(worker_slots::offset_of(7, slots.first_direct, slots.slot_bytes, chunk),
            6 * (chunk / 4) + chunk);
}

}  // namespace
}  // namespace ferry
