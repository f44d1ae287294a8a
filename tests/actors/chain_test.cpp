/// Bytes that some, not all, of an instance's workers registered travel along a chain: the trainer
/// writes each such chunk once, to the first of them, and each worker relays it to the next. Every
/// worker ends with exactly its ranges, and nothing around them is touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
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

/// Memory for one registered range, with canary bytes on both sides.
struct guarded {
  static constexpr std::size_t guard = 64;
  static constexpr std::byte canary{0xab};
  std::vector<std::byte> bytes;
  explicit guarded(std::size_t n) : bytes(n + 2 * guard, canary) {}
  std::byte* data() { return bytes.data() + guard; }
  std::span<const std::byte> range() const {
    return {bytes.data() + guard, bytes.size() - 2 * guard};
  }
  bool canaries_intact() const {
    for (std::size_t i = 0; i < guard; ++i) {
      if (bytes[i] != canary || bytes[bytes.size() - 1 - i] != canary) return false;
    }
    return true;
  }
};

constexpr std::uint64_t row = 100;  // bytes: rows straddle the 1 KiB chunks

// One instance of three workers. "all" is on every worker (its leader and collective carry it);
// "rows" has rows [0, 40) on worker 0 and [24, 64) on worker 1, so rows [24, 40) go along a chain
// 0 -> 1; "pair" is on workers 1 and 2 (a chain 1 -> 2); "solo" on worker 2 alone.
const std::vector<tensor_spec> table{
    make_tensor_spec("all", dtype::u8, {3000}), make_tensor_spec("rows", dtype::u8, {64, row}),
    make_tensor_spec("pair", dtype::u8, {5000}), make_tensor_spec("solo", dtype::u8, {2000})};
struct range {
  std::size_t tensor;
  std::uint64_t offset, bytes;
};
const std::array<std::vector<range>, 3> ranges{{
    {{0, 0, 3000}, {1, 0, 40 * row}},
    {{0, 0, 3000}, {1, 24 * row, 40 * row}, {2, 0, 5000}},
    {{0, 0, 3000}, {2, 0, 5000}, {3, 0, 2000}},
}};

TEST(chain, some_workers_of_an_instance_get_their_shared_bytes_relayed_and_only_theirs) {
  event_loop loop;
  virtual_environment env{loop};
  env.trace().keep_records();
  inproc_network network;
  std::vector<std::unique_ptr<node>> nodes;
  for (node_id id = 0; id < 5; ++id) {
    nodes.push_back(
        std::make_unique<node>(env, id, inproc_transport::make(env, network, id), protocol()));
    ASSERT_FALSE(nodes.back()->start());
    if (id > 0) {
      ASSERT_FALSE(network.find(id)->add_peer(0, "0"));
    }
  }
  job_coordinator coordinator(*nodes[0], 1,
                              job_shape{.trainers = 1, .instance_sizes = {3}, .chunk_bytes = 1024});
  std::uint64_t delivered = 0;
  std::string failed;
  coordinator.on_delivered = [&](const version_report& r) { delivered = r.version; };
  coordinator.on_failed = [&](const std::string& why) { failed = why; };
  coordinator.start();

  std::vector<std::vector<std::byte>> weights;
  std::vector<tensor_ref> published;
  for (const auto& t : table) {
    weights.emplace_back(t.nbytes);
    published.push_back({.spec = t, .data = weights.back().data()});
  }
  trainer_shard trainer(*nodes[1], 1, {0, 1}, 0, published);
  std::array<std::vector<guarded>, 3> memory;
  std::vector<std::unique_ptr<rollout_worker>> workers;
  for (std::uint32_t r = 0; r < 3; ++r) {
    std::vector<tensor_ref> mine;
    for (const auto& g : ranges[r]) {
      memory[r].emplace_back(g.bytes);
      mine.push_back({.spec = table[g.tensor],
                      .data = memory[r].back().data(),
                      .part = byte_range{g.offset, g.bytes}});
    }
    workers.push_back(
        std::make_unique<rollout_worker>(*nodes[2 + r], 1, address{0, 1}, 0, r, std::move(mine),
                                         worker_options{.make_broadcast = host_chain(chain_tag)}));
  }
  trainer.join();
  for (auto& w : workers) w->join();
  const auto before = [&](std::chrono::seconds limit) {
    return env.clock().now() < clock::time_point(limit);
  };
  loop.run_until([&] { return trainer.ready() || !before(std::chrono::seconds(60)); });
  ASSERT_TRUE(trainer.ready());

  // Another member of the job, on the trainer's node, asks worker 2 for a direct slot for a chunk
  // of "solo" and writes a chunk_sent into worker 2's first direct slot (2: after its `depth`
  // broadcast slots): neither came from the chunk's trainer with a grant, so both are dropped.
  const auto& plan = *coordinator.current_plan();
  const auto solo = std::find_if(plan.chunks.begin(), plan.chunks.end(), [&](const chunk_info& c) {
    return plan.tensors[c.pieces.front().tensor].name == "solo";
  });
  ASSERT_NE(solo, plan.chunks.end());
  actor rogue(*nodes[1], 2);
  rogue.set_epoch(plan.epoch);
  rogue.start();
  rogue.send({4, 1}, slot_request{.version = 1, .chunk = solo->id});
  rogue.send(
      {4, 1},
      chunk_sent{.version = 1, .chunk = solo->id, .slot = 2, .checksum = 1, .chunk_checksum = 1});

  for (std::uint64_t v = 1; v <= 2; ++v) {
    for (std::size_t t = 0; t < weights.size(); ++t) {
      for (std::size_t i = 0; i < weights[t].size(); ++i)
        weights[t][i] = static_cast<std::byte>(i * 13 + t * 7 + v);
    }
    std::string why;
    ASSERT_TRUE(trainer.publish(v, why)) << why;
    loop.run_until([&] {
      return delivered == v || !failed.empty() || !before(std::chrono::seconds(120 * v));
    });
    ASSERT_EQ(delivered, v) << failed;
    for (std::uint32_t r = 0; r < 3; ++r) {
      for (std::size_t i = 0; i < ranges[r].size(); ++i) {
        const auto& g = ranges[r][i];
        const std::span<const std::byte> sent(weights[g.tensor].data() + g.offset, g.bytes);
        EXPECT_TRUE(std::ranges::equal(memory[r][i].range(), sent))
            << "worker " << r << ", " << table[g.tensor].name << ", version " << v;
        EXPECT_TRUE(memory[r][i].canaries_intact())
            << "worker " << r << " wrote around " << table[g.tensor].name;
      }
    }
  }

  // The trainer writes every chunk once (one leader, one write per chain); the workers of each
  // chain relay what the next one needs.
  const auto& p = *coordinator.current_plan();
  const auto& inst = p.instances.at(0);
  std::uint64_t relayed = 0;  // per version: a chain of m workers relays a chunk m - 1 times
  for (const auto& c : p.chunks) {
    const auto hearers = p.hearers(inst, c.audience).size();
    if (!p.whole_instance(inst, c.audience)) relayed += (hearers - 1) * c.bytes;
  }
  EXPECT_GT(relayed, 16 * row);                            // rows [24, 40) and "pair", at least
  std::map<std::uint32_t, std::uint64_t> sent, broadcast;  // node -> bytes of both versions
  for (const auto& rec : env.trace().records()) {
    if (!rec.instant && rec.what == stage::send) sent[rec.node] += rec.bytes;
    if (!rec.instant && rec.what == stage::broadcast) broadcast[rec.node] += rec.bytes;
  }
  EXPECT_EQ(sent[1], 2 * p.total_bytes());
  // The leader's broadcasts of "all" (worker 0 leads: its node is 2), and relays along the chains.
  std::uint64_t all_bytes = 0;
  for (const auto& c : p.chunks) {
    if (p.whole_instance(inst, c.audience)) all_bytes += c.bytes;
  }
  EXPECT_EQ(broadcast[2] + broadcast[3] + broadcast[4], 2 * (relayed + 3 * all_bytes));
  EXPECT_EQ(broadcast[4], 2 * all_bytes) << "worker 2 is last in every chain: it relays nothing";
  EXPECT_EQ(env.trace().instants().at("slot_request not for a chunk its trainer sends here"), 1u);
  EXPECT_EQ(env.trace().instants().at("chunk_sent not from the chunk's trainer"), 1u);
  coordinator.stop_job();
}

}  // namespace
}  // namespace ferry
