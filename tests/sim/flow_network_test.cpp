#include "sim/flow_network.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "runtime/event_loop.hpp"
#include "runtime/virtual_environment.hpp"
#include "sim/cluster.hpp"
#include "sim/collective_model.hpp"

namespace ferry::sim {
namespace {

using namespace std::chrono_literals;

/// A virtual-time loop and a network on it; `finish(n)` runs until `n` transfers are done.
struct bench {
  event_loop loop;
  virtual_environment env{loop};
  flow_network net{loop, env.clock()};
  std::vector<clock::duration> done_at;

  std::function<void()> record() {
    return [this] { done_at.push_back(env.clock().now().time_since_epoch()); };
  }
  void finish(std::size_t n) {
    loop.run_until([&] { return done_at.size() >= n; });
  }
};

constexpr double G = 1e9;

TEST(flow_network, two_transfers_on_one_link_get_half_each) {
  bench b;
  const auto link = b.net.add_resource("link", 1 * G);
  const auto first = b.net.start({.bytes = 1'000'000'000, .path = {{link}}}, b.record());
  const auto second = b.net.start({.bytes = 1'000'000'000, .path = {{link}}}, b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(first), 0.5 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(second), 0.5 * G);
  b.finish(2);
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{2s, 2s}));
  EXPECT_DOUBLE_EQ(b.net.usage(link).carried_bytes, 2 * G);
  EXPECT_EQ(b.net.usage(link).busy, 2s);
}

TEST(flow_network, a_transfer_bottlenecked_elsewhere_leaves_its_share_to_the_other) {
  bench b;
  const auto narrow = b.net.add_resource("narrow", 1 * G);
  const auto shared = b.net.add_resource("shared", 3 * G);
  const auto slow = b.net.start({.bytes = 1'000'000'000, .path = {{narrow}, {shared}}}, b.record());
  const auto fast = b.net.start({.bytes = 4'000'000'000, .path = {{shared}}}, b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(slow), 1 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(fast), 2 * G);
  b.finish(2);
  // slow: 1 GB at 1 GB/s. fast: 2 GB in that second, then the other 2 GB alone at 3 GB/s.
  EXPECT_EQ(b.done_at[0], 1s);
  EXPECT_EQ(b.done_at[1], 1'666'666'667ns);
  EXPECT_NEAR(b.net.usage(shared).carried_bytes, 5 * G, 1);
}

TEST(flow_network, rates_are_recomputed_when_a_transfer_starts_later) {
  bench b;
  const auto link = b.net.add_resource("link", 1 * G);
  b.net.start({.bytes = 1'500'000'000, .path = {{link}}}, b.record());
  b.env.clock().async_wait(1s, [&](std::error_code) {
    b.net.start({.bytes = 500'000'000, .path = {{link}}}, b.record());
  });
  b.finish(2);
  // 1 GB alone in the first second; then 0.5 GB each at 0.5 GB/s: both end at 2 s.
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{2s, 2s}));
  EXPECT_EQ(b.net.usage(link).busy, 2s);
}

TEST(flow_network, the_pcie_duplex_cap_binds_only_when_both_directions_run) {
  bench b;
  cluster c(b.net, {.nodes = 1,
                    .gpus_per_node = 1,
                    .sockets_per_node = 1,
                    .nics_per_node = 1,
                    .pcie_d2h_rate = 55 * G,
                    .pcie_h2d_rate = 55 * G,
                    .pcie_duplex_rate = 92 * G,
                    .host_memory_rate = 1000 * G,
                    .pcie_latency = 0us});
  const auto alone = b.net.start(c.offload(0).of(55'000'000'000), b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(alone), 55 * G);
  b.finish(1);
  EXPECT_EQ(b.done_at[0], 1s);
  const auto down = b.net.start(c.offload(0).of(46'000'000'000), b.record());
  const auto up = b.net.start(c.upload(0).of(46'000'000'000), b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(down), 46 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(up), 46 * G);
  b.finish(3);
  EXPECT_EQ(b.done_at[2], 2s);
}

TEST(flow_network, latency_is_added_once_after_the_last_byte) {
  bench b;
  const auto link = b.net.add_resource("link", 1 * G);
  b.net.start({.bytes = 1'000'000, .path = {{link}}, .latency = 5us}, b.record());
  b.net.start({.bytes = 0, .path = {{link}}, .latency = 7us}, b.record());
  b.finish(2);
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{7us, 1ms + 5us}));
}

TEST(flow_network, transfers_due_within_a_nanosecond_arrive_together_in_the_order_they_started) {
  bench b;
  const auto slow = b.net.add_resource("slow", 1 * G);
  const auto fast = b.net.add_resource("fast", 1 * G * (1 + 1e-7));  // 0.1 ns sooner over 1 ms
  const auto other = b.net.add_resource("other", 1 * G);
  std::vector<std::string> order;
  auto named = [&](std::string name) {
    return [&, name, record = b.record()] { order.push_back(name), record(); };
  };
  b.net.start({.bytes = 1'000'000, .path = {{slow}}}, named("first"));
  b.net.start({.bytes = 1'000'000, .path = {{fast}}}, named("second, due sooner"));
  b.net.start({.bytes = 1'000'003, .path = {{other}}}, named("3 ns later"));
  b.finish(3);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second, due sooner", "3 ns later"}));
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{1ms, 1ms, 1ms + 3ns}));
}

TEST(flow_network, many_transfers_on_one_link_arrive_smallest_first) {
  bench b;
  const auto link = b.net.add_resource("link", 1 * G);
  std::vector<std::uint64_t> sizes, arrived;
  for (std::uint64_t i = 0; i < 200; ++i) sizes.push_back(1'000 + (i * 7'919) % 200 * 1'000);
  for (const auto bytes : sizes)
    b.net.start({.bytes = bytes, .path = {{link}}}, [&, bytes, record = b.record()] {
      arrived.push_back(bytes);
      record();
    });
  b.finish(sizes.size());
  auto expected = sizes;
  std::ranges::sort(expected);
  EXPECT_EQ(arrived, expected);
  EXPECT_EQ(b.net.in_flight(), 0u);
  // Fair shares: the last byte of all leaves when the link has carried them all.
  const auto total = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
  EXPECT_NEAR(std::chrono::duration<double>(b.done_at.back()).count(), total / G, 1e-9);
}

TEST(flow_network, a_copy_uses_its_memory_twice_and_one_thread_at_most) {
  bench b;
  cluster c(b.net, {.nodes = 1,
                    .gpus_per_node = 1,
                    .sockets_per_node = 1,
                    .host_memory_rate = 20 * G,
                    .copy_threads = 4,
                    .copy_thread_rate = 8 * G,
                    .copy_latency = 0us});
  const auto one = b.net.start(c.host_copy(0, 0).of(8'000'000'000), b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(one), 8 * G);  // one thread's speed, not the memory's 20/2
  const auto two = b.net.start(c.host_copy(0, 0).of(5'000'000'000), b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(one), 5 * G);  // now the memory binds: 20 GB/s over 2 x 2
  EXPECT_DOUBLE_EQ(b.net.rate_of(two), 5 * G);
  b.finish(2);
  // Both at 5 GB/s for 1 s; then `one` alone at 8 GB/s for its last 3 GB.
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{1s, 1375ms}));
}

TEST(flow_network, a_cap_of_its_own_leaves_the_rest_to_the_others) {
  bench b;
  const auto link = b.net.add_resource("link", 10 * G);
  const auto capped =
      b.net.start({.bytes = 1'000'000'000, .path = {{link}}, .max_rate = 1 * G}, b.record());
  const auto free = b.net.start({.bytes = 9'000'000'000, .path = {{link}}}, b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(capped), 1 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(free), 9 * G);
  b.finish(2);
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{1s, 1s}));
}

TEST(flow_network, nics_on_different_nodes_share_only_what_they_cross) {
  bench b;
  cluster c(b.net, {.nodes = 3,
                    .gpus_per_node = 1,
                    .sockets_per_node = 1,
                    .nics_per_node = 1,
                    .nic_rate = 50 * G,
                    .host_memory_rate = 1000 * G,
                    .nic_latency = 0us});
  // Two senders into one receiver share its NIC's receive side; a third pair is untouched.
  const auto a = b.net.start(c.network(0, 2).of(25'000'000'000), b.record());
  const auto bb = b.net.start(c.network(1, 2).of(25'000'000'000), b.record());
  const auto other = b.net.start(c.network(2, 0).of(50'000'000'000), b.record());
  EXPECT_DOUBLE_EQ(b.net.rate_of(a), 25 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(bb), 25 * G);
  EXPECT_DOUBLE_EQ(b.net.rate_of(other), 50 * G);
  b.finish(3);
  EXPECT_EQ(b.done_at, (std::vector<clock::duration>{1s, 1s, 1s}));
}

TEST(flow_network, an_oversubscribed_fabric_is_shared_by_every_crossing) {
  bench b;
  cluster c(b.net, {.nodes = 4,
                    .gpus_per_node = 1,
                    .sockets_per_node = 1,
                    .nics_per_node = 1,
                    .nic_rate = 50 * G,
                    .host_memory_rate = 1000 * G,
                    .fabric_oversubscription = 2});
  // Fabric: 4 x 50 / 2 = 100 GB/s for four 50 GB/s flows.
  std::vector<std::uint64_t> ids;
  for (unsigned g = 0; g < 4; ++g)
    ids.push_back(b.net.start(c.network(g, (g + 1) % 4).of(1'000'000), b.record()));
  for (const auto id : ids) EXPECT_DOUBLE_EQ(b.net.rate_of(id), 25 * G);
  b.finish(4);
}

/// Max-min fair rates by progressive filling over every transfer, written plainly: what the
/// network's incremental solver must agree with.
std::vector<double> fair_rates(const std::vector<double>& capacity,
                               const std::vector<transfer_spec>& specs) {
  std::vector<double> rate(specs.size(), 0), left = capacity;
  std::vector<bool> fixed(specs.size(), false);
  for (std::size_t unfixed = specs.size(); unfixed > 0;) {
    std::vector<double> weight(capacity.size(), 0);
    double level = std::numeric_limits<double>::infinity();
    for (std::size_t f = 0; f < specs.size(); ++f)
      if (!fixed[f]) {
        level = std::min(level, specs[f].max_rate);
        for (const auto& h : specs[f].path) weight[h.id] += h.weight;
      }
    for (std::size_t r = 0; r < capacity.size(); ++r)
      if (weight[r] > 0) level = std::min(level, std::max(0.0, left[r]) / weight[r]);
    const double limit = level * (1 + 1e-9);
    std::vector<std::size_t> fixing;
    for (std::size_t f = 0; f < specs.size(); ++f) {
      if (fixed[f]) continue;
      bool bound = specs[f].max_rate <= limit;
      for (const auto& h : specs[f].path)
        bound = bound || std::max(0.0, left[h.id]) <= limit * weight[h.id];
      if (bound) fixing.push_back(f);
    }
    for (const auto f : fixing) {
      fixed[f] = true;
      rate[f] = std::min(level, specs[f].max_rate);
      for (const auto& h : specs[f].path) left[h.id] -= h.weight * rate[f];
    }
    unfixed -= fixing.size();
  }
  return rate;
}

/// Transfers start at random times over random paths of shared resources, with rates and caps
/// from a few values so that levels tie. After every start and every arrival each transfer's rate
/// must be the one a solve of all of them gives, and each must arrive when those rates have moved
/// its bytes.
TEST(flow_network, incremental_rates_match_a_solve_of_every_transfer) {
  for (std::uint32_t seed = 1; seed <= 3000; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 random(seed);
    auto pick = [&](std::uint32_t n) { return static_cast<std::uint32_t>(random() % n); };
    bench b;
    std::vector<double> capacity;
    const auto resources = 4 + pick(24);
    for (std::uint32_t r = 0; r < resources; ++r) {
      capacity.push_back(std::array{1.0, 2.0, 4.0, 5.0, 10.0}[pick(5)] * G);
      b.net.add_resource("r" + std::to_string(r), capacity.back());
    }
    struct moving {
      transfer_spec spec;
      double left, rate = 0;  // bytes and bytes/s by the solve of all, as of `since`
    };
    std::map<std::uint64_t, moving> live;
    double since = 0;
    auto seconds = [&] {
      return std::chrono::duration<double>(b.env.clock().now().time_since_epoch()).count();
    };
    auto move_bytes = [&] {
      for (auto& [id, m] : live) m.left -= m.rate * (seconds() - since);
      since = seconds();
    };
    std::size_t checks = 0, arrived = 0;
    auto check = [&] {
      move_bytes();
      std::vector<transfer_spec> specs;
      for (const auto& [id, m] : live) specs.push_back(m.spec);
      const auto expected = fair_rates(capacity, specs);
      ASSERT_EQ(b.net.in_flight(), live.size());
      std::size_t k = 0;
      for (auto& [id, m] : live) {
        m.rate = expected[k++];
        ASSERT_NEAR(b.net.rate_of(id), m.rate, m.rate * 1e-6) << "transfer " << id;
      }
      ++checks;
    };
    const std::size_t transfers = 60 + pick(60);
    for (std::size_t n = 0; n < transfers; ++n) {
      transfer_spec spec{.bytes = 1'000'000 * (1 + pick(50))};
      for (auto hops = 1 + pick(4); spec.path.size() < hops;)
        spec.path.push_back({pick(resources), pick(4) == 0 ? 2.0f : 1.0f});
      if (pick(5) == 0) spec.max_rate = std::array{0.5, 1.0, 3.0}[pick(3)] * G;
      // Many start at the same instant, as chunks do.
      const auto at = std::chrono::microseconds(1'000 * pick(4) * pick(10));
      b.env.clock().async_wait(at, [&, spec](std::error_code) {
        auto id = std::make_shared<std::uint64_t>();
        *id = b.net.start(spec, [&, id] {
          move_bytes();
          const auto& m = live.at(*id);
          // Arrival waits for the clock's next nanosecond.
          EXPECT_NEAR(m.left, 0, 1e-6 * m.spec.bytes + m.rate * 1e-9) << "transfer " << *id;
          live.erase(*id);
          ++arrived;
          b.loop.post(check);
        });
        live.emplace(*id, moving{.spec = spec, .left = static_cast<double>(spec.bytes)});
        b.loop.post(check);
      });
    }
    b.loop.run_until([&] { return arrived == transfers || ::testing::Test::HasFatalFailure(); });
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_EQ(b.net.in_flight(), 0u);
    EXPECT_GE(checks, 2 * transfers);
  }
}

TEST(collective_model, a_chain_broadcast_takes_the_bytes_once_plus_the_pipeline_fill) {
  bench b;
  std::vector<path> links;
  for (int i = 0; i < 3; ++i) links.push_back({{b.net.add_resource("link", 1 * G)}});
  // Three links of 1 GB/s: 1 GB streams through in 1 s, and the last rank starts two 1 MB
  // slices (1 ms each) and two latencies late, plus the last link's latency.
  async_chain_broadcast(b.net, links, 1'000'000'000,
                        {.slice_bytes = 1'000'000, .per_link_latency = 10us}, b.record());
  b.finish(1);
  EXPECT_EQ(b.done_at[0], 1s + 2 * (1ms + 10us) + 10us);
}

TEST(collective_model, a_ring_all_gather_moves_all_but_its_own_piece_over_each_link) {
  bench b;
  std::vector<path> links;
  std::vector<resource_id> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(b.net.add_resource("link", 1 * G));
    links.push_back({{ids.back()}});
  }
  // 4 ranks, 4 GB: each link carries 3 GB (3 s); two more steps of a 1 MB slice fill the ring.
  async_ring_all_gather(b.net, links, 4'000'000'000, {.slice_bytes = 1'000'000}, b.record());
  b.finish(1);
  EXPECT_EQ(b.done_at[0], 3s + 2ms);
  for (const auto id : ids) EXPECT_DOUBLE_EQ(b.net.usage(id).carried_bytes, 3 * G);
}

TEST(cluster, validate_names_the_field) {
  EXPECT_EQ(validate({}), "");
  EXPECT_EQ(validate({.nic_rate = 0}), "hardware.nic_gbps: a rate must be positive");
  EXPECT_EQ(validate({.gpus_per_node = 0}), "hardware.gpus_per_node: must be at least 1");
  EXPECT_EQ(validate({.fabric_oversubscription = 0.5}),
            "hardware.fabric_oversubscription: must be at least 1");
}

}  // namespace
}  // namespace ferry::sim
