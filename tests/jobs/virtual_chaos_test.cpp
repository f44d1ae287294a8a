#include "jobs/virtual_chaos.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "runtime/log.hpp"

namespace ferry {
namespace {

/// What a failing seed's reader runs to see it again, event for event.
std::string replay(std::uint64_t seed) {
  return fmt::format("ferry chaos --virtual --seed {} --json", seed);
}

TEST(virtual_chaos, one_seed_gives_one_run_event_for_event) {
  log::set_level(log::level::off);
  const auto a = run_virtual_chaos({.seed = 3});
  const auto b = run_virtual_chaos({.seed = 3});
  ASSERT_TRUE(a.verified) << a.error << "\n  replay: " << replay(3);
  EXPECT_EQ(a.trace_digest, b.trace_digest);
  EXPECT_EQ(a.trace_events, b.trace_events);
  EXPECT_EQ(a.faults, b.faults);
  EXPECT_EQ(a.virtual_seconds, b.virtual_seconds);
  EXPECT_GT(a.kills, 0u);
  EXPECT_EQ(a.delivered, 6u);
}

/// `ferry sim` hands messages over as objects: through kills and regroups, that must be the run
/// frames give, event for event.
TEST(virtual_chaos, messages_handed_over_give_the_run_frames_give) {
  log::set_level(log::level::off);
  for (const std::uint64_t seed : {3, 5, 11, 12}) {  // each with kills and regroups
    for (const auto sharding : {rollout_sharding::none, rollout_sharding::ep}) {
      const auto frames = run_virtual_chaos({.seed = seed, .sharding = sharding});
      const auto objects =
          run_virtual_chaos({.seed = seed, .sharding = sharding, .hand_over_messages = true});
      ASSERT_TRUE(objects.verified) << objects.error << "\n  replay: " << replay(seed);
      EXPECT_EQ(frames.trace_digest, objects.trace_digest) << "seed " << seed;
      EXPECT_EQ(frames.faults, objects.faults) << "seed " << seed;
      EXPECT_GT(objects.kills, 0u) << "seed " << seed;
    }
  }
}

TEST(virtual_chaos, other_seeds_give_other_runs) {
  log::set_level(log::level::off);
  const auto a = run_virtual_chaos({.seed = 4});
  const auto b = run_virtual_chaos({.seed = 5});
  EXPECT_NE(a.trace_digest, b.trace_digest);
}

/// A job of one instance that loses both its workers mid-update has no worker left to plan for
/// until their replacements join: the update in flight must wait for them, not complete against
/// the plan the regroup dropped (a use-after-free under ASan before the coordinator waited for a
/// plan in force). Seeds 3, 11, 19, ... draw that fault first.
TEST(virtual_chaos, an_instance_losing_every_worker_mid_update_waits_for_replacements) {
  log::set_level(log::level::off);
  std::uint32_t hit = 0;
  for (std::uint64_t seed = 3; seed < 3 + 8 * 25; seed += 8) {
    const auto r = run_virtual_chaos({.seed = seed, .instances = 1, .workers_per_instance = 2});
    EXPECT_TRUE(r.verified) << "seed " << seed << ": " << r.error << "\n  replay: " << replay(seed)
                            << " (with one instance of two workers)";
    hit += r.faults.contains("every worker of an instance killed mid-update") ? 1 : 0;
  }
  EXPECT_GT(hit, 0u);
}

/// 500 seeds in shards of 125 (ctest runs them side by side); every run must deliver every
/// version and leave every live worker byte-identical to the last one, and across each shard
/// every fault kind must come up.
class seed_sweep : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(seed_sweep, every_seed_delivers_every_version_byte_for_byte) {
  log::set_level(log::level::off);
  constexpr std::uint64_t per_shard = 125;
  std::map<std::string, std::uint32_t> seen;
  for (std::uint64_t seed = GetParam() * per_shard + 1; seed <= (GetParam() + 1) * per_shard;
       ++seed) {
    const auto r = run_virtual_chaos({.seed = seed});
    EXPECT_TRUE(r.verified) << "seed " << seed << ": " << r.error << "\n  replay: " << replay(seed);
    for (const auto& [kind, times] : r.faults) seen[kind] += times;
  }
  for (const char* kind :
       {"leader killed mid-update", "two regroups within one chunk time",
        "trainer killed mid-update, rejoined", "late joiner as the last event",
        "every worker of an instance killed mid-update", "a new instance joined mid-update",
        "an instance left mid-update", "a worker died unannounced, reported by a peer",
        "a member cut off briefly, its frames held",
        "a member cut off past the heartbeat timeout, readmitted",
        "registrations lost: the coordinator started late",
        "old epoch's chain forward still reads its slot", "stale write dropped",
        "new epoch waits for old readers", "new epoch waits for older writes to land"}) {
    EXPECT_GT(seen[kind], 0u) << "no seed of this shard hit: " << kind;
  }
  std::string tally;
  for (const auto& [kind, times] : seen) tally += fmt::format("\n  {}: {}", kind, times);
  std::printf("seeds %llu-%llu:%s\n", static_cast<unsigned long long>(GetParam() * per_shard + 1),
              static_cast<unsigned long long>((GetParam() + 1) * per_shard), tally.c_str());
}
INSTANTIATE_TEST_SUITE_P(virtual_chaos, seed_sweep, ::testing::Values(0u, 1u, 2u, 3u));

/// Sharded rollouts under the same faults: each worker receives and keeps only its part (experts,
/// rows, or a pipeline stage's rows and norms, which go along chains), and regroups, resumed
/// updates and late joiners still leave each part exact.
class sharded_seed_sweep : public ::testing::TestWithParam<rollout_sharding> {};

TEST_P(sharded_seed_sweep, every_seed_delivers_each_workers_part_byte_for_byte) {
  log::set_level(log::level::off);
  const auto sharding = GetParam();
  std::map<std::string, std::uint32_t> seen;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const auto r = run_virtual_chaos({.seed = seed, .sharding = sharding});
    EXPECT_TRUE(r.verified) << "seed " << seed << ": " << r.error << "\n  replay: " << replay(seed)
                            << " --shard-rollout " << rollout_sharding_name(sharding);
    for (const auto& [kind, times] : r.faults) seen[kind] += times;
  }
  for (const char* kind :
       {"leader killed mid-update", "trainer killed mid-update, rejoined",
        "late joiner as the last event", "every worker of an instance killed mid-update",
        "a new instance joined mid-update", "an instance left mid-update"}) {
    EXPECT_GT(seen[kind], 0u) << "no seed hit: " << kind;
  }
}
INSTANTIATE_TEST_SUITE_P(virtual_chaos, sharded_seed_sweep,
                         ::testing::Values(rollout_sharding::ep, rollout_sharding::tp,
                                           rollout_sharding::pp_tp),
                         [](const auto& sharding) {
                           auto name = std::string(rollout_sharding_name(sharding.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace ferry
