/// A job's last workers may take a version and leave at once, before the trainer's shard reports
/// it (its digests take a while): no plan comes into force while no worker is left, yet each of
/// them held the version, so the shard's report must deliver it. On virtual time, where a slow
/// CPU puts the shard's report after both leaves, every run the same.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/rollout_worker.hpp"
#include "actors/trainer_shard.hpp"
#include "collectives/host/chain_broadcast.hpp"
#include "protocol/protocol.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t model_bytes = 1 << 20;

/// A trainer shard and an instance of two workers, on virtual time, with version 1 published.
class departure : public ::testing::Test {
 protected:
  void SetUp() override {
    for (node_id id = 0; id < 5; ++id) {
      nodes.push_back(
          std::make_unique<node>(env, id, inproc_transport::make(env, network, id), protocol()));
      ASSERT_FALSE(nodes.back()->start());
    }
    for (node_id id = 1; id < 5; ++id) ASSERT_FALSE(network.find(id)->add_peer(0, "0"));
    coordinator = std::make_unique<job_coordinator>(
        *nodes[0], 1, job_shape{.trainers = 1, .instance_sizes = {2}, .chunk_bytes = 16384});
    coordinator->on_delivered = [this](const version_report& r) {
      delivered = r.version;
      verified = r.verified;
    };
    coordinator->on_update = [this](std::uint64_t v, bool, const std::vector<node_id>&) {
      started = v;
    };
    coordinator->on_regroup = [this](const regroup_report& r) { regroups.push_back(r); };
    coordinator->start();
    for (std::size_t i = 0; i < weights.size(); ++i)
      weights[i] = static_cast<std::byte>(i * 13 + 5);
    trainer = std::make_unique<trainer_shard>(
        *nodes[1], 1, address{0, 1}, 0,
        std::vector<tensor_ref>{{.spec = spec, .data = weights.data()}});
    trainer->on_delivered = [this](std::uint64_t v, bool) { trainer_heard = v; };
    trainer->join();
    first = worker(2, 0, first_bytes);
    second = worker(3, 1, second_bytes);
    ASSERT_TRUE(run_until([&] { return trainer->ready(); }));
    std::string why;
    ASSERT_TRUE(trainer->publish(1, why)) << why;
  }

  /// A worker of instance 0 on node `id`, writing into `bytes`; digests off, so it reports the
  /// version as soon as its last chunk is applied.
  std::unique_ptr<rollout_worker> worker(node_id id, std::uint32_t rank,
                                         std::vector<std::byte>& bytes) {
    bytes.assign(model_bytes, std::byte{0});
    auto w = std::make_unique<rollout_worker>(
        *nodes[id], 1, address{0, 1}, 0, rank,
        std::vector<tensor_ref>{{.spec = spec, .data = bytes.data()}},
        worker_options{.digests = false, .make_broadcast = host_chain(chain_tag)});
    w->join();
    return w;
  }

  bool run_until(const std::function<bool()>& done) {
    loop.run_until(
        [&] { return done() || env.clock().now() >= clock::time_point(std::chrono::seconds(60)); });
    return done();
  }

  /// Both workers take version 1 and leave at once, before the shard reports it.
  void both_take_it_and_leave() {
    ASSERT_TRUE(run_until([&] { return first->version() == 1 && second->version() == 1; }));
    first->leave("done");
    second->leave("done");
    ASSERT_TRUE(
        run_until([&] { return !coordinator->current_plan(); }));  // no worker left to plan for
    ASSERT_EQ(delivered, 0u)
        << "the shard reported before the workers left: this test no longer tests the race";
  }

  event_loop loop;
  // 100 MB/s: the shard's digest of 1 MiB takes 10 ms, a chunk's apply 0.2 ms.
  virtual_environment env{loop, cpu_cost_model{.bytes_per_second = 100e6}};
  inproc_network network;
  std::vector<std::unique_ptr<node>> nodes;
  std::unique_ptr<job_coordinator> coordinator;
  std::vector<std::byte> weights = std::vector<std::byte>(model_bytes);
  tensor_spec spec = make_tensor_spec("w", dtype::u8, {model_bytes});
  std::unique_ptr<trainer_shard> trainer;
  std::vector<std::byte> first_bytes, second_bytes, joiner_bytes;
  std::unique_ptr<rollout_worker> first, second;
  std::uint64_t delivered = 0;
  bool verified = false;
  std::uint64_t trainer_heard = 0;  ///< the version the trainer heard was delivered
  std::uint64_t started = 0;        ///< the last version whose update started
  std::vector<regroup_report> regroups;
};

/// A cause as the test names it: its kind's name and node.
std::pair<std::string, node_id> named(const regroup_cause& c) {
  return {std::string(regroup_cause_name(c.what)), c.node.value_or(0)};
}

TEST_F(departure, the_last_workers_leaving_with_a_version_before_the_shard_reports_it_deliver_it) {
  both_take_it_and_leave();

  EXPECT_TRUE(run_until([&] { return trainer_heard == 1; }));
  EXPECT_EQ(delivered, 1u);
  EXPECT_TRUE(verified);
  EXPECT_EQ(first_bytes, weights);
  EXPECT_EQ(second_bytes, weights);
  coordinator->stop_job();
}

/// A worker that joins before the shard reports is under a new plan: the version is resent to it,
/// and delivered once it holds it.
TEST_F(departure, a_worker_joining_after_them_is_sent_the_version_before_it_is_delivered) {
  both_take_it_and_leave();
  const auto joiner = worker(4, 0, joiner_bytes);

  ASSERT_TRUE(run_until([&] { return trainer_heard == 1; }));
  EXPECT_EQ(joiner->version(), 1u);
  EXPECT_EQ(joiner_bytes, weights);
  EXPECT_TRUE(verified);
  // One regroup, from the first leave to the joiner's plan in force, with every cause typed.
  ASSERT_EQ(regroups.size(), 1u);
  std::vector<std::pair<std::string, node_id>> causes;
  for (const auto& c : regroups[0].causes) causes.push_back(named(c));
  EXPECT_EQ(causes, (std::vector<std::pair<std::string, node_id>>{
                        {"left", 2}, {"left", 3}, {"worker_joined", 4}}));
  EXPECT_EQ(regroups[0].reason(),
            "worker 0.0 (node 2) left: done; worker 0.1 (node 3) left: done; worker 0.0 joined "
            "(node 4)");
  coordinator->stop_job();
}

/// A worker that joins after them and leaves before it holds the version takes nothing from it:
/// the shard's report still delivers it to the workers that held it.
TEST_F(departure, a_worker_joining_and_leaving_without_the_version_takes_nothing_from_it) {
  both_take_it_and_leave();
  const auto joiner = worker(4, 0, joiner_bytes);
  ASSERT_TRUE(run_until([&] { return coordinator->current_plan().has_value(); }));  // planned for
  joiner->leave("changed its mind");
  ASSERT_TRUE(run_until([&] { return !coordinator->current_plan(); }));
  ASSERT_EQ(delivered, 0u)
      << "the shard reported before the joiner left: this test no longer tests it";

  EXPECT_TRUE(run_until([&] { return trainer_heard == 1; }));
  EXPECT_EQ(delivered, 1u);
  EXPECT_EQ(joiner->version(), 0u);
  EXPECT_EQ(first_bytes, weights);
  EXPECT_EQ(second_bytes, weights);
  coordinator->stop_job();
}

/// Workers that leave as the update starts, before any chunk reaches them, leave the version to
/// the next worker to join: the shard's report alone delivers nothing.
TEST_F(departure, workers_leaving_without_the_version_leave_it_to_the_next_joiner) {
  ASSERT_TRUE(run_until([&] { return started == 1; }));
  first->leave("gone early");
  second->leave("gone early");
  const auto later = env.clock().now() + std::chrono::seconds(1);  // the shard's report is in
  run_until([&] { return env.clock().now() >= later; });
  EXPECT_EQ(delivered, 0u);
  EXPECT_EQ(first->version(), 0u);

  const auto joiner = worker(4, 0, joiner_bytes);
  ASSERT_TRUE(run_until([&] { return trainer_heard == 1; }));
  EXPECT_EQ(delivered, 1u);
  EXPECT_EQ(joiner->version(), 1u);
  EXPECT_EQ(joiner_bytes, weights);
  coordinator->stop_job();
}

}  // namespace
}  // namespace ferry
