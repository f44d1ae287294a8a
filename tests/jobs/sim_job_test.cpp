#include "jobs/sim_job.hpp"

#include <gtest/gtest.h>

#include "actors/synthetic_model.hpp"

namespace ferry {
namespace {

/// 8 nodes of 8 GPUs: 32 trainer GPUs to 4 instances of 8, 400 Gb/s per GPU.
sim_config sixty_four_gpus() {
  sim_config c;
  c.hardware = {
      .nodes = 8, .gpus_per_node = 8, .sockets_per_node = 2, .nics_per_node = 8, .nic_rate = 50e9};
  c.trainers = 32;
  c.instances = 4;
  c.instance_size = 8;
  c.model = synthetic_transformer(16ull << 30);
  c.chunk_bytes = 64ull << 20;
  c.depth = 4;
  c.stripes = 8;
  return c;
}

TEST(sim_job, a_small_job_delivers_and_never_beats_its_bound) {
  auto c = sixty_four_gpus();
  ASSERT_EQ(validate(c), "");
  const auto r = run_sim(c);
  ASSERT_TRUE(r.delivered) << r.error;
  EXPECT_EQ(r.update_seconds.size(), 2u);
  EXPECT_GE(r.predicted_seconds, r.bound_seconds);
  EXPECT_GT(r.bound_seconds, 0);
  std::printf(
      "predicted %.4f s bound %.4f s (%s) stall %.4f s actors %u wall %.2f s transfers %lu\n",
      r.predicted_seconds, r.bound_seconds, r.bottleneck.c_str(), r.stall, r.actors, r.wall_seconds,
      (unsigned long)r.transfers);
}

}  // namespace
}  // namespace ferry
