#include "jobs/sim_job.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>

#include "actors/synthetic_model.hpp"
#include "jobs/sim_scenario.hpp"
#include "sim/copy_model.hpp"

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
  // The second version's pace: its records, not the first's nor the set-up's wall time.
  EXPECT_GT(r.steady_events, 0u);
  EXPECT_LT(r.steady_events, r.trace_events);
  EXPECT_GT(r.steady_wall_seconds, 0);
  EXPECT_LT(r.steady_wall_seconds, r.wall_seconds);
  std::printf(
      "predicted %.4f s bound %.4f s (%s) stall %.4f s actors %u wall %.2f s transfers %lu\n",
      r.predicted_seconds, r.bound_seconds, r.bottleneck.c_str(), r.stall, r.actors, r.wall_seconds,
      (unsigned long)r.transfers);
}

/// Per node of a Chrome trace, the most of its send stages that overlap: with one leader per
/// instance, a trainer shard's writes in flight to it.
std::map<int, int> sends_at_once(const std::string& trace_path) {
  std::map<int, std::vector<std::pair<double, int>>> edges;  // node -> (time, +1 start / -1 end)
  const std::regex send(
      R"re("ph":"X","name":"send v[0-9]+ c[0-9]+".*"pid":([0-9]+).*"ts":([0-9.]+),"dur":([0-9.]+))re");
  std::ifstream in(trace_path);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (!std::regex_search(line, m, send)) continue;
    const double ts = std::stod(m[2]), dur = std::stod(m[3]);
    edges[std::stoi(m[1])].push_back({ts, +1});
    edges[std::stoi(m[1])].push_back({ts + dur, -1});
  }
  std::map<int, int> most;
  for (auto& [node, e] : edges) {
    std::ranges::sort(e);  // an end before a start at the same moment: a slot handed on
    int open = 0;
    for (const auto& [at, step] : e) most[node] = std::max(most[node], open += step);
  }
  return most;
}

/// A trainer writes to a leader only into a slot the leader freed: `depth` writes at most. Fewer
/// may be on the wire, as a slot stays taken until the leader has passed its chunk on.
TEST(sim_job, a_trainer_never_has_more_than_depth_writes_in_flight_to_a_leader) {
  const auto trace = std::filesystem::path(::testing::TempDir()) / "sim_depth_trace.json";
  for (const std::uint32_t depth : {1u, 3u}) {
    sim_config c;
    c.hardware = {.nodes = 2,
                  .gpus_per_node = 4,
                  .sockets_per_node = 1,
                  .nics_per_node = 4,
                  .nic_rate = 50e9};
    c.trainers = 2;
    c.instances = 1;
    c.instance_size = 4;
    c.stripes = 1;
    c.depth = depth;
    c.model = synthetic_transformer(2ull << 30);
    c.chunk_bytes = 64ull << 20;
    c.trace_path = trace.string();
    const auto r = run_sim(c);
    ASSERT_TRUE(r.delivered) << r.error;
    const auto most = sends_at_once(c.trace_path);
    ASSERT_EQ(most.size(), c.trainers) << "sends on other nodes than the trainers'";
    int deepest = 0;
    for (const auto& [node, n] : most) {
      EXPECT_LE(n, static_cast<int>(depth)) << "node " << node << ", depth " << depth;
      deepest = std::max(deepest, n);
    }
    // The writes do overlap where the depth lets them: the sweep sees them.
    EXPECT_EQ(deepest > 1, depth > 1)
        << "depth " << depth << ": at most " << deepest << " writes at once";
  }
  std::filesystem::remove(trace);
}

/// Every rate of the cluster and every modelled CPU rate, times `k`.
sim_config with_rates_times(sim_config c, double k) {
  auto& h = c.hardware;
  for (double* rate :
       {&h.nic_rate, &h.pcie_d2h_rate, &h.pcie_h2d_rate, &h.pcie_duplex_rate, &h.host_memory_rate,
        &h.nvlink_rate, &h.copy_thread_rate, &c.checksum_rate}) {
    *rate *= k;
  }
  return c;
}

TEST(sim_job, doubling_every_rate_halves_a_bandwidth_bound_prediction) {
  const auto base = run_sim(sixty_four_gpus());
  const auto fast = run_sim(with_rates_times(sixty_four_gpus(), 2));
  ASSERT_TRUE(base.delivered && fast.delivered) << base.error << fast.error;
  EXPECT_NEAR(fast.predicted_seconds / base.predicted_seconds, 0.5, 0.5 * 0.05)
      << "predicted " << base.predicted_seconds << " s, then " << fast.predicted_seconds << " s";
  EXPECT_NEAR(fast.bound_seconds / base.bound_seconds, 0.5, 1e-6);
  std::printf("doubled rates: predicted %.4f -> %.4f s (x%.4f)\n", base.predicted_seconds,
              fast.predicted_seconds, fast.predicted_seconds / base.predicted_seconds);
  EXPECT_GE(fast.predicted_seconds, fast.bound_seconds);
}

/// Row-parallel rollouts each receive 1/n of the model over their own NIC: with one leader per
/// instance, whose NIC carries the whole model otherwise and bounds the update, the update gets
/// well shorter (bound then by the trainers' nodes, which send the same bytes either way).
TEST(sim_job, sharded_rollouts_lift_a_leader_nic_bound) {
  auto whole = sixty_four_gpus();
  whole.stripes = 1;
  auto tp = whole;
  tp.shard_rollout = rollout_sharding::tp;
  auto ep = whole;
  ep.shard_rollout = rollout_sharding::ep;
  const auto a = run_sim(whole), b = run_sim(tp), e = run_sim(ep);
  ASSERT_TRUE(a.delivered && b.delivered && e.delivered) << a.error << b.error << e.error;
  const double ratio = b.predicted_seconds / a.predicted_seconds;
  EXPECT_LT(ratio, 0.5) << "whole " << a.predicted_seconds << " s, tp " << b.predicted_seconds
                        << " s";
  EXPECT_GE(b.predicted_seconds, b.bound_seconds);
  EXPECT_LT(e.predicted_seconds, a.predicted_seconds);
  std::printf(
      "one leader per instance of %u: whole %.4f s (bound %.4f, %s), tp %.4f s (x%.3f; bound %.4f, "
      "%s), ep %.4f s\n",
      whole.instance_size, a.predicted_seconds, a.bound_seconds, a.bottleneck.c_str(),
      b.predicted_seconds, ratio, b.bound_seconds, b.bottleneck.c_str(), e.predicted_seconds);
}

/// One host: a trainer GPU and an instance of three, through the trainer's host copies (GPU to GPU
/// would need neither). With shared host copies the leader reads the trainer's host copy in place:
/// no send stage, and no more time than the copy through the leader's receive slots. Across hosts
/// they are refused before the run.
TEST(sim_job, shared_host_copies_skip_the_send_on_one_host) {
  sim_config c;
  c.hardware = {
      .nodes = 2, .gpus_per_node = 4, .sockets_per_node = 1, .nics_per_node = 1, .nic_rate = 50e9};
  c.trainers = 1;
  c.first_worker_gpu = 1;
  c.instances = 1;
  c.instance_size = 3;
  c.model = synthetic_transformer(4ull << 30);
  c.chunk_bytes = 64ull << 20;
  c.p2p = p2p_mode::host;
  auto shared = c;
  shared.shared_host_copies = true;
  ASSERT_EQ(validate(shared), "");
  const auto copied = run_sim(c), in_place = run_sim(shared);
  ASSERT_TRUE(copied.delivered && in_place.delivered) << copied.error << in_place.error;
  EXPECT_GT(copied.stage_busy.send, 0);
  EXPECT_EQ(in_place.stage_busy.send, 0);
  EXPECT_GT(in_place.stage_busy.upload, 0);
  EXPECT_LE(in_place.predicted_seconds, copied.predicted_seconds);
  EXPECT_GE(in_place.predicted_seconds, in_place.bound_seconds);
  std::printf("one host: through the receive slots %.4f s, read in place %.4f s (bound %.4f, %s)\n",
              copied.predicted_seconds, in_place.predicted_seconds, in_place.bound_seconds,
              in_place.bottleneck.c_str());

  shared.first_worker_gpu = 4;  // the instance on the second node
  EXPECT_NE(validate(shared).find("ferry.shared_host_copies"), std::string::npos)
      << validate(shared);
}

double model_bytes(const sim_config& c) {
  double bytes = 0;
  for (const auto& t : c.model) bytes += static_cast<double>(t.nbytes);
  return bytes;
}

/// The bytes the resources whose names match `names` carried over the whole run.
double bytes_on(const sim_result& r, const std::string& names) {
  const std::regex match(names);
  double bytes = 0;
  for (const auto& u : r.resources)
    if (std::regex_search(u.name, match)) bytes += u.bytes;
  return bytes;
}

/// One node of 8 GPUs (PCIe Gen5, NVLink 450 GB/s per direction): trainers on GPUs 0-3, an
/// instance of 4 on GPUs 4-7, one leader.
sim_config one_node_of_eight() {
  return {.hardware = {.nodes = 1, .gpus_per_node = 8, .sockets_per_node = 2, .nics_per_node = 8},
          .trainers = 4,
          .first_worker_gpu = 4,
          .instances = 1,
          .instance_size = 4,
          .model = synthetic_transformer(4ull << 30),
          .depth = 4};
}

/// On one node with peer access, `auto` has every worker read the trainers' device copies GPU to
/// GPU: each byte leaves a trainer's GPU once over NVLink, none crosses PCIe, host memory or a copy
/// thread, and the update takes the leader's NVLink plus, on the same copy stream, the apply's
/// in-device copy. Through the trainers' host copies (`host`) the leader's PCIe bounds it.
TEST(sim_job, device_direct_on_one_node_moves_the_update_over_nvlink) {
  const auto c = one_node_of_eight();
  auto host = c;
  host.p2p = p2p_mode::host;
  ASSERT_EQ(validate(c), "");
  const auto direct = run_sim(c), staged = run_sim(host);
  ASSERT_TRUE(direct.delivered && staged.delivered) << direct.error << staged.error;
  const double model = model_bytes(c), bytes = model * c.versions;
  EXPECT_NEAR(bytes_on(direct, "^gpu[0-3] nvlink tx$"), bytes, 0.01 * bytes);
  EXPECT_NEAR(bytes_on(direct, "^gpu4 nvlink rx$"), bytes, 0.01 * bytes);
  EXPECT_EQ(bytes_on(direct, "pcie|memory|copy threads|nic"), 0);
  EXPECT_NE(direct.bottleneck.find("nvlink"), std::string::npos) << direct.bottleneck;
  const double nvlink = model / c.hardware.nvlink_rate;
  EXPECT_GE(direct.predicted_seconds, nvlink);
  EXPECT_LT(direct.predicted_seconds, 1.1 * (nvlink + model / sim::device_copy_rate));

  EXPECT_NEAR(bytes_on(staged, "^gpu4 pcie h2d$"), bytes, 0.01 * bytes);
  EXPECT_EQ(bytes_on(staged, "^gpu[0-3] nvlink tx$"), 0);
  const double ratio = staged.predicted_seconds / direct.predicted_seconds;
  EXPECT_GT(ratio, 5) << "device-direct " << direct.predicted_seconds << " s, host "
                      << staged.predicted_seconds << " s";
  std::printf(
      "one node: device-direct %.4f s (bound %.4f, %s), through host memory %.4f s (%s): x%.2f\n",
      direct.predicted_seconds, direct.bound_seconds, direct.bottleneck.c_str(),
      staged.predicted_seconds, staged.bottleneck.c_str(), ratio);
}

/// Without peer access no worker's GPU reads a trainer's: `auto` is the run through host memory,
/// to the bit, and `device`, which insists, fails naming both GPUs.
TEST(sim_job, without_peer_access_auto_goes_through_host_memory) {
  auto c = one_node_of_eight();
  c.hardware.peer_access = false;
  auto host = c, device = c;
  host.p2p = p2p_mode::host;
  device.p2p = p2p_mode::device;
  const auto automatic = run_sim(c), staged = run_sim(host), forced = run_sim(device);
  ASSERT_TRUE(automatic.delivered && staged.delivered) << automatic.error << staged.error;
  EXPECT_EQ(automatic.update_seconds, staged.update_seconds);
  EXPECT_GT(bytes_on(automatic, "^gpu4 pcie h2d$"), 0);
  EXPECT_FALSE(forced.delivered);
  EXPECT_NE(forced.error.find("has no peer access to gpu"), std::string::npos) << forced.error;
}

/// Two nodes of four GPUs: trainers on GPUs 0-1, instance 0 on GPUs 2-3 of their node, instance
/// 1 on GPUs 4-5 of the other. Instance 0 reads GPU to GPU; instance 1 still goes through the
/// trainers' host copies (filled from their device copies), the NICs and its leader's PCIe. With
/// no worker on the trainers' node, `auto` is the run through host memory, to the bit.
TEST(sim_job, a_worker_on_another_node_still_goes_through_host_memory) {
  const sim_config c{
      .hardware = {.nodes = 2, .gpus_per_node = 4, .sockets_per_node = 1, .nics_per_node = 4},
      .trainers = 2,
      .first_worker_gpu = 2,
      .instances = 2,
      .instance_size = 2,
      .model = synthetic_transformer(2ull << 30)};
  ASSERT_EQ(validate(c), "");
  const auto r = run_sim(c);
  ASSERT_TRUE(r.delivered) << r.error;
  const double bytes = model_bytes(c) * c.versions;
  EXPECT_NEAR(bytes_on(r, "^gpu[01] pcie d2h$"), bytes, 0.01 * bytes);
  EXPECT_NEAR(bytes_on(r, "^node1 nic[0-9]+ rx$"), bytes, 0.01 * bytes);
  EXPECT_NEAR(bytes_on(r, "^gpu4 pcie h2d$"), bytes, 0.01 * bytes);
  EXPECT_NEAR(bytes_on(r, "^gpu2 nvlink rx$"), bytes, 0.01 * bytes);
  EXPECT_EQ(bytes_on(r, "^gpu2 pcie h2d$"), 0);

  auto away = c;
  away.instances = 1;
  away.first_worker_gpu = 4;
  auto away_host = away;
  away_host.p2p = p2p_mode::host;
  const auto automatic = run_sim(away), staged = run_sim(away_host);
  ASSERT_TRUE(automatic.delivered && staged.delivered) << automatic.error << staged.error;
  EXPECT_EQ(automatic.update_seconds, staged.update_seconds);
  EXPECT_EQ(bytes_on(automatic, "nvlink"), bytes_on(staged, "nvlink"));
}

/// `ferry.p2p` takes "auto", "device" or "host", from the file or `--set`; anything else is
/// refused naming the key.
TEST(sim_job, a_scenario_refuses_a_malformed_p2p_naming_the_key) {
  const auto path = std::filesystem::path(::testing::TempDir()) / "sim_p2p.toml";
  auto load = [&](const std::string& ferry_table, std::vector<std::string> sets = {},
                  const std::string& hardware = "") {
    std::ofstream(path)
        << "[hardware]\nnodes = 1\ngpus_per_node = 4\nnic_gbps = 400\npcie_d2h_gbs = 55\n"
           "pcie_h2d_gbs = 55\nhost_memory_gbs = 300\nnvlink_gbs = 450\ncopy_thread_gbs = 10\n"
        << hardware << "[model]\nbytes = \"1GiB\"\n"
        << "[placement]\ntrainers = 2\ninstances = 1\ninstance_size = 2\nfirst_worker_gpu = 2\n"
        << "[ferry]\n"
        << ferry_table;
    sim_config c;
    auto why = load_scenario(path.string(), sets, c);
    return std::pair{why, c.p2p};
  };
  EXPECT_EQ(load(""), std::pair(std::string(), p2p_mode::automatic));
  EXPECT_EQ(load("p2p = \"host\"\n"), std::pair(std::string(), p2p_mode::host));
  EXPECT_EQ(load("p2p = \"device\"\n", {"ferry.p2p=host"}),
            std::pair(std::string(), p2p_mode::host));
  EXPECT_EQ(load("p2p = \"host\"\n", {"p2p=auto"}), std::pair(std::string(), p2p_mode::automatic));
  for (const auto& [table, sets] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{{"p2p = \"gpu\"\n", {}},
                                                                     {"p2p = 1\n", {}},
                                                                     {"", {"ferry.p2p=nvlink"}},
                                                                     {"p2p = \"Auto\"\n", {}}}) {
    const auto [why, mode] = load(table, sets);
    EXPECT_NE(why.find("ferry.p2p: "), std::string::npos) << table << ": " << why;
  }
  EXPECT_NE(load("", {}, "peer_access = \"yes\"\n")
                .first.find("hardware.peer_access: must be true or false"),
            std::string::npos);
  std::filesystem::remove(path);
}

/// A worker killed at a seeded moment of the first update (and rank): the job regroups around it
/// and still delivers every version to the workers left.
TEST(sim_job, a_seeded_kill_regroups_and_still_delivers) {
  const auto clean = run_sim(sixty_four_gpus());
  ASSERT_TRUE(clean.delivered) << clean.error;
  for (const std::uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 draw(seed);
    auto c = sixty_four_gpus();
    c.events.push_back({.what = sim_event::kind::kill_worker,
                        .at_seconds = std::uniform_real_distribution<double>(0.1, 0.9)(draw) *
                                      clean.update_seconds.front(),
                        .instance = static_cast<std::uint32_t>(draw() % c.instances),
                        .rank = static_cast<std::uint32_t>(draw() % c.instance_size)});
    const auto r = run_sim(c);
    EXPECT_TRUE(r.delivered) << "seed " << seed << ": " << r.error;
    EXPECT_EQ(r.kills, 1u) << "seed " << seed;
    EXPECT_GE(r.regroups, 1u) << "seed " << seed;
    EXPECT_EQ(r.update_seconds.size(), 2u) << "seed " << seed;
  }
}

}  // namespace
}  // namespace ferry
