#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "jobs/local_job.hpp"

namespace ferry {
namespace {

job_config small_job() {
  job_config c;
  c.trainers = 2;
  c.instances = 2;
  c.workers_per_instance = 3;
  c.model_bytes = 24ull << 20;
  c.chunk_bytes = 1ull << 20;
  c.depth = 2;
  c.versions = 3;
  return c;
}

TEST(weight_update, every_worker_holds_every_version) {
  const auto r = run_local_job(small_job());
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified) << r.error;
  ASSERT_EQ(r.versions.size(), 3u);
  for (std::size_t i = 0; i < r.versions.size(); ++i) {
    EXPECT_EQ(r.versions[i].version, i + 1);
    EXPECT_TRUE(r.versions[i].verified);
    EXPECT_EQ(r.versions[i].workers, 6u);
  }
  EXPECT_GT(r.chunks, 20u);
}

TEST(weight_update, progress_tells_each_member_made_then_ready_then_each_version) {
  std::vector<std::string> lines;
  const auto r =
      run_local_job(small_job(), [&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(lines.size(), 8u + 1 + 3);  // 2 trainer shards and 6 workers, ready, 3 versions
  EXPECT_TRUE(lines[0].starts_with("set-up: 1 of 8 members made, trainer shard 0 with 0.01 GB"))
      << lines[0];
  EXPECT_TRUE(lines[7].starts_with("set-up: 8 of 8 members made, worker 1.2 with 0.02 GB"))
      << lines[7];
  EXPECT_TRUE(lines[8].starts_with("set-up: ready after ")) << lines[8];
  for (int v = 1; v <= 3; ++v)
    EXPECT_TRUE(lines[8 + v].starts_with("version " + std::to_string(v) + "/3: ")) << lines[8 + v];
}

class depths : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(depths, pipeline_depth_does_not_change_the_bytes) {
  auto c = small_job();
  c.depth = GetParam();
  c.versions = 2;
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified) << r.error;
}
INSTANTIATE_TEST_SUITE_P(weight_update, depths, ::testing::Values(1u, 2u, 4u, 8u));

/// Striping: k leaders per instance, each receiving one stripe of every chunk, then the
/// instance all-gathers; k = 1 is the classic point-to-point + broadcast.
class stripes : public ::testing::TestWithParam<std::tuple<std::string, std::uint32_t>> {};

/// Runs `c` (3 versions) and checks that each arrived verified, through `c.stripes` leaders.
void expect_every_version_verified(const job_config& c) {
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified) << r.error;
  EXPECT_EQ(r.stripes, c.stripes);
  ASSERT_EQ(r.versions.size(), 3u);
  for (const auto& v : r.versions) EXPECT_TRUE(v.verified);
}

TEST_P(stripes, every_stripe_count_delivers_the_same_bytes) {
  auto c = small_job();
  c.transport = std::get<0>(GetParam());
  c.stripes = std::get<1>(GetParam());
  expect_every_version_verified(c);
}
INSTANTIATE_TEST_SUITE_P(weight_update, stripes,
                         ::testing::Combine(::testing::Values("inproc", "tcp"),
                                            ::testing::Values(1u, 2u, 3u)));

/// Shared host copies: leaders read each chunk in the trainer's host copy instead of receiving a
/// write (host leaders copy it into their receive slot for the chain).
class shared_host_copies : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(shared_host_copies, leaders_reading_in_place_deliver_the_same_bytes) {
  auto c = small_job();
  c.stripes = GetParam();
  c.shared_host_copies = true;
  expect_every_version_verified(c);
}
INSTANTIATE_TEST_SUITE_P(weight_update, shared_host_copies, ::testing::Values(1u, 3u));

TEST(weight_update, chunks_too_small_for_every_stripe_leave_some_empty) {
  auto c = small_job();
  c.model_bytes = 1ull << 20;
  c.chunk_bytes = 512;  // stripes of 256, 256 and 0 bytes
  c.stripes = 3;
  c.versions = 2;
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified) << r.error;
  EXPECT_EQ(r.stripes, 3u);
}

TEST(weight_update, more_stripes_than_workers_means_every_worker_leads) {
  auto c = small_job();
  c.stripes = 8;
  c.versions = 2;
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified) << r.error;
  EXPECT_EQ(r.stripes, 3u);
}

TEST(weight_update, single_worker_instances_and_one_trainer) {
  auto c = small_job();
  c.trainers = 1;
  c.instances = 3;
  c.workers_per_instance = 1;
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified);
}

TEST(weight_update, chunk_larger_than_the_model_is_one_chunk_per_shard) {
  auto c = small_job();
  c.chunk_bytes = 64ull << 20;
  const auto r = run_local_job(c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.verified);
  EXPECT_EQ(r.chunks, 2u);
}

TEST(weight_update, bad_chunk_size_fails_before_any_byte_moves) {
  auto c = small_job();
  c.chunk_bytes = 100;
  const auto r = run_local_job(c);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("alignment"), std::string::npos) << r.error;
  EXPECT_TRUE(r.versions.empty());
}

TEST(weight_update, a_stop_between_versions_ends_the_job_there) {
  auto c = small_job();
  c.versions = 1000;
  std::stop_source stop;
  int lines = 0;
  const auto r = run_local_job(
      c,
      [&](const std::string& line) {
        if (line.starts_with("version ") && ++lines == 2) stop.request_stop();
      },
      stop.get_token());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.versions.size(), 2u);
  EXPECT_EQ(r.error, "stopped after 2 of 1000 versions");
}

TEST(weight_update, a_stop_from_another_thread_ends_the_job_mid_update) {
  auto c = small_job();
  c.transport = "tcp";
  c.versions = 1000;
  std::stop_source stop;
  std::atomic<bool> first = false;
  // Updates follow each other without a pause: a stop at any moment is most likely mid-update.
  std::thread stopper([&] {
    while (!first) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    stop.request_stop();
  });
  const auto r = run_local_job(
      c, [&](const std::string& line) { first = first || line.starts_with("version "); },
      stop.get_token());
  stopper.join();
  EXPECT_TRUE(r.interrupted) << r.error;
  EXPECT_GE(r.versions.size(), 1u);
  EXPECT_LT(r.versions.size(), 1000u);
  for (const auto& v : r.versions) EXPECT_TRUE(v.verified);
}

TEST(weight_update, a_stop_before_the_start_moves_no_version) {
  std::stop_source stop;
  stop.request_stop();
  const auto r = run_local_job(small_job(), {}, stop.get_token());
  EXPECT_TRUE(r.interrupted);
  EXPECT_TRUE(r.versions.empty());
}

}  // namespace
}  // namespace ferry
