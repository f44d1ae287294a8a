/// A job member takes its plan, its orders and its verdicts from the coordinator only: another
/// member of the job, authenticated like any, cannot stop, fail or replan it.
#include <gtest/gtest.h>

#include <optional>
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

/// A job of one trainer shard and one worker, ready on virtual time, and node 3: linked to the
/// coordinator like a member, but neither the coordinator nor the shard.
class one_shard_one_worker : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* n : {&hub, &trainer_node, &worker_node, &rogue_node}) ASSERT_FALSE(n->start());
    for (node_id id : {1, 2, 3}) ASSERT_FALSE(network.find(id)->add_peer(0, "0"));
    coordinator.on_delivered = [this](const version_report& r) { delivered = r; };
    coordinator.on_update = [this](std::uint64_t v, bool, const std::vector<node_id>&) {
      started.push_back(v);
    };
    coordinator.start();
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<std::byte>(i * 7 + 1);
    trainer.join();
    worker.join();
    loop.run_until([&] { return trainer.ready() || !before(std::chrono::seconds(60)); });
    ASSERT_TRUE(trainer.ready());
  }
  bool before(std::chrono::seconds limit) { return env.clock().now() < clock::time_point(limit); }
  /// Publishes version 1, waits for its delivery, then 10 s more for anything that follows it.
  void publish_and_settle() {
    std::string why;
    ASSERT_TRUE(trainer.publish(1, why)) << why;
    loop.run_until([&] { return delivered || !before(std::chrono::seconds(120)); });
    const auto settled = env.clock().now() + std::chrono::seconds(10);
    loop.run_until([&] { return env.clock().now() >= settled; });
  }

  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  node hub{env, 0, inproc_transport::make(env, network, 0), protocol()};
  node trainer_node{env, 1, inproc_transport::make(env, network, 1), protocol()};
  node worker_node{env, 2, inproc_transport::make(env, network, 2), protocol()};
  node rogue_node{env, 3, inproc_transport::make(env, network, 3), protocol()};
  job_coordinator coordinator{hub, 1,
                              job_shape{.trainers = 1, .instance_sizes = {1}, .chunk_bytes = 4096}};
  std::optional<version_report> delivered;
  std::vector<std::uint64_t> started;  ///< the versions whose update the coordinator started
  std::vector<std::byte> weights = std::vector<std::byte>(10000),
                         received = std::vector<std::byte>(10000);
  tensor_spec spec = make_tensor_spec("w", dtype::u8, {10000});
  trainer_shard trainer{trainer_node, 1, {0, 1}, 0, {{.spec = spec, .data = weights.data()}}};
  rollout_worker worker{worker_node,
                        1,
                        {0, 1},
                        0,
                        0,
                        std::vector<tensor_ref>{{.spec = spec, .data = received.data()}},
                        worker_options{.make_broadcast = host_chain(chain_tag)}};
};

TEST_F(one_shard_one_worker, orders_from_a_member_other_than_the_coordinator_are_dropped) {
  // Node 3 is a member of the job's network, not its coordinator: every order it gives is dropped.
  for (node_id id : {1, 2}) ASSERT_FALSE(rogue_node.transport().add_peer(id, std::to_string(id)));
  actor rogue(rogue_node, 1);
  rogue.start();
  for (const address to : {address{1, 1}, address{2, 1}}) {
    rogue.send(to, job_stop{.reason = "a rogue says stop"});
    rogue.send(to, job_failed{.reason = "a rogue says fail"});
    rogue.send(to, register_again{.replaced = true});
    rogue.send(to, update_failed{.version = 1, .reason = "a rogue says version 1 failed"});
  }
  rogue.send({1, 1}, version_delivered{.version = 1, .verified = false});
  publish_and_settle();

  ASSERT_TRUE(delivered);
  EXPECT_EQ(delivered->version, 1u);
  EXPECT_EQ(received, weights);
  EXPECT_FALSE(trainer.failed() || trainer.stopped());
  EXPECT_FALSE(worker.failed() || worker.stopped());
  EXPECT_EQ(env.trace().instants().at("order not from the coordinator"), 9u);
  coordinator.stop_job();
}

/// The coordinator takes a shard's reports (publish started, offloaded, sent, done with its
/// digests) from that shard only: another member's would start a version no shard published, or
/// count the shard done before it is, with digests of its choosing.
TEST_F(one_shard_one_worker, shard_reports_from_anyone_but_the_shard_are_dropped) {
  // Node 3 says shard 0 published version 1000, and reports version 1 for it before the shard
  // could: hours of stall and busy time, and a digest of its own.
  actor rogue(rogue_node, 1);
  rogue.set_epoch(coordinator.current_plan()->epoch);
  rogue.start();
  constexpr double hours = 7200;
  rogue.send({0, 1}, publish_started{.shard = 0, .version = 1000});
  rogue.send({0, 1}, shard_offloaded{.shard = 0, .version = 1, .seconds = hours});
  rogue.send({0, 1}, shard_sent{.shard = 0, .version = 1, .send_seconds = hours});
  rogue.send({0, 1}, shard_done{.shard = 0,
                                .version = 1,
                                .busy = {.offload = hours},
                                .digests = {{.segment = 0, .low = 1, .high = 2}}});
  publish_and_settle();

  ASSERT_TRUE(delivered);
  EXPECT_EQ(delivered->version, 1u);
  EXPECT_EQ(started, std::vector<std::uint64_t>{1});
  EXPECT_EQ(trainer.next_version(), 2u);
  EXPECT_TRUE(delivered->verified);
  EXPECT_EQ(coordinator.digest_mismatches(), 0u);
  EXPECT_LT(delivered->offloaded_seconds, hours);
  EXPECT_LT(delivered->busy.offload, hours);
  EXPECT_LT(delivered->busy.send, hours);
  EXPECT_EQ(received, weights);
  EXPECT_EQ(env.trace().instants().at("shard report not from its shard"), 4u);
  coordinator.stop_job();
}

/// Which slot holds which chunk, and the order an instance takes its chunks in, come from the
/// chunk's trainer and the instance's first leader only: a forged chunk_sent would have a leader
/// read a slot no trainer wrote, a forged chunk_announce a follower broadcast out of order.
TEST(chunk_messages, from_anyone_but_their_sender_are_dropped) {
  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  node hub{env, 0, inproc_transport::make(env, network, 0), protocol()};
  node trainer_node{env, 1, inproc_transport::make(env, network, 1), protocol()};
  node leader_node{env, 2, inproc_transport::make(env, network, 2), protocol()};
  node follower_node{env, 3, inproc_transport::make(env, network, 3), protocol()};
  node rogue_node{env, 4, inproc_transport::make(env, network, 4), protocol()};
  for (auto* n : {&hub, &trainer_node, &leader_node, &follower_node, &rogue_node})
    ASSERT_FALSE(n->start());
  for (node_id id : {1, 2, 3, 4}) ASSERT_FALSE(network.find(id)->add_peer(0, "0"));
  for (node_id id : {2, 3}) ASSERT_FALSE(rogue_node.transport().add_peer(id, std::to_string(id)));

  job_coordinator coordinator(hub, 1,
                              job_shape{.trainers = 1, .instance_sizes = {2}, .chunk_bytes = 4096});
  std::uint64_t delivered = 0;
  coordinator.on_delivered = [&](const version_report& r) { delivered = r.version; };
  coordinator.start();
  std::vector<std::byte> weights(10000), leader_bytes(10000), follower_bytes(10000);
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<std::byte>(i * 7 + 1);
  const auto spec = make_tensor_spec("w", dtype::u8, {10000});
  trainer_shard trainer(trainer_node, 1, {0, 1}, 0, {{.spec = spec, .data = weights.data()}});
  const worker_options options{.make_broadcast = host_chain(chain_tag)};
  rollout_worker leader(leader_node, 1, {0, 1}, 0, 0,
                        std::vector<tensor_ref>{{.spec = spec, .data = leader_bytes.data()}},
                        options);
  rollout_worker follower(follower_node, 1, {0, 1}, 0, 1,
                          std::vector<tensor_ref>{{.spec = spec, .data = follower_bytes.data()}},
                          options);
  trainer.join();
  leader.join();
  follower.join();
  const auto before = [&](std::chrono::seconds limit) {
    return env.clock().now() < clock::time_point(limit);
  };
  loop.run_until([&] { return trainer.ready() || !before(std::chrono::seconds(60)); });
  ASSERT_TRUE(trainer.ready());
  ASSERT_TRUE(leader.is_leader());
  ASSERT_FALSE(follower.is_leader());

  // Node 4 speaks in the plan's epoch, as a member of the job would.
  actor rogue(rogue_node, 1);
  rogue.set_epoch(coordinator.current_plan()->epoch);
  rogue.start();
  rogue.send({2, 1},
             chunk_sent{.version = 1, .chunk = 0, .slot = 0, .checksum = 1, .chunk_checksum = 1});
  rogue.send({3, 1}, chunk_announce{.version = 1, .chunk = 2, .checksum = 1});
  // The trainer's node is a member too, but it orders nothing.
  actor trainer_voice(trainer_node, 2);
  trainer_voice.set_epoch(coordinator.current_plan()->epoch);
  trainer_voice.start();
  trainer_voice.send({3, 1}, chunk_announce{.version = 1, .chunk = 1, .checksum = 1});
  std::string why;
  ASSERT_TRUE(trainer.publish(1, why)) << why;
  loop.run_until([&] { return delivered == 1 || !before(std::chrono::seconds(120)); });

  EXPECT_EQ(delivered, 1u);
  EXPECT_EQ(leader_bytes, weights);
  EXPECT_EQ(follower_bytes, weights);
  EXPECT_FALSE(leader.failed() || follower.failed());
  EXPECT_EQ(env.trace().instants().at("chunk_sent not from the chunk's trainer"), 1u);
  EXPECT_EQ(env.trace().instants().at("chunk_announce not from the first leader"), 2u);
  coordinator.stop_job();
}

}  // namespace
}  // namespace ferry
