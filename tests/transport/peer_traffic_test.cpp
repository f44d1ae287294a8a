#include "transport/fabric/peer_traffic.hpp"

#include <gtest/gtest.h>

namespace ferry::fabric_link {
namespace {

using namespace std::chrono_literals;

const peer_traffic::time_point t0 = peer_traffic::time_point{} + 1h;
constexpr auto timeout = std::chrono::milliseconds(1000);

waiting_op send(std::uint64_t id) {
  return {waiting_op::kind::send, id};
}

TEST(peer_traffic,
     a_peer_that_takes_nothing_for_the_timeout_is_stalled_and_one_that_progresses_is_not) {
  peer_traffic traffic;
  traffic.accepted(1, t0);
  traffic.accepted(2, t0);
  EXPECT_TRUE(traffic.stalled(t0, timeout).empty());
  traffic.progressed(2, t0 + 900ms);
  const auto stalled = traffic.stalled(t0 + 1001ms, timeout);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].peer, 1u);
  EXPECT_EQ(stalled[0].in_flight, 1u);
  EXPECT_TRUE(traffic.stalled(t0 + 1100ms, timeout).empty()) << "checked once per period";
  traffic.completed(1, false, t0 + 1200ms);
  EXPECT_TRUE(traffic.stalled(t0 + 2500ms, timeout).size() == 1)
      << "peer 2 went quiet for over the timeout";
}

TEST(peer_traffic, an_idle_peer_never_stalls_and_waiting_starts_its_clock) {
  peer_traffic traffic;
  traffic.accepted(1, t0);
  traffic.completed(1, false, t0 + 1ms);
  EXPECT_TRUE(traffic.stalled(t0 + 1h, timeout).empty());
  traffic.wait(1, send(7), t0 + 2h);
  EXPECT_TRUE(traffic.busy());
  EXPECT_TRUE(traffic.stalled(t0 + 2h + 999ms, timeout).empty());
  const auto stalled = traffic.stalled(t0 + 2h + 2s, timeout);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].waiting, 1u);
}

TEST(peer_traffic, waiting_operations_are_retried_in_order_until_one_is_refused) {
  peer_traffic traffic;
  for (std::uint64_t id = 1; id <= 4; ++id) traffic.wait(1, send(id), t0);
  traffic.wait(2, send(10), t0);
  EXPECT_TRUE(traffic.must_wait(1));
  std::vector<std::uint64_t> tried;
  traffic.retry_waiting([](node_id) { return true; },
                        [&](waiting_op op) {
                          tried.push_back(op.id);
                          return op.id != 3;
                        });
  EXPECT_EQ(tried, (std::vector<std::uint64_t>{1, 2, 3, 10}));
  tried.clear();
  traffic.wait(2, send(11), t0);
  traffic.retry_waiting([](node_id peer) { return peer == 1; },
                        [&](waiting_op op) {
                          tried.push_back(op.id);
                          return true;
                        });
  EXPECT_EQ(tried, (std::vector<std::uint64_t>{3, 4})) << "peer 2's link is not ready";
  EXPECT_FALSE(traffic.must_wait(1));
  EXPECT_TRUE(traffic.must_wait(2));
}

TEST(peer_traffic, an_order_holder_keeps_later_traffic_waiting) {
  peer_traffic traffic;
  traffic.accepted(1, t0);
  traffic.hold_order(1);
  EXPECT_TRUE(traffic.must_wait(1));
  traffic.wait(1, send(2), t0);
  int tried = 0;
  traffic.retry_waiting([](node_id) { return true; }, [&](waiting_op) { return ++tried > 0; });
  EXPECT_EQ(tried, 0);
  traffic.release_order(1);
  traffic.retry_waiting([](node_id) { return true; }, [&](waiting_op) { return ++tried > 0; });
  EXPECT_EQ(tried, 1);
}

TEST(peer_traffic, a_forgotten_peer_drops_what_waits_and_its_flights_no_longer_count_as_busy) {
  peer_traffic traffic;
  traffic.accepted(1, t0);
  traffic.wait(1, send(2), t0);
  traffic.forget(1);
  EXPECT_FALSE(traffic.busy()) << "its operation in flight may never complete";
  EXPECT_FALSE(traffic.must_wait(1));
  traffic.completed(1, true, t0 + 1s);
  EXPECT_FALSE(traffic.busy());
  traffic.accepted(1, t0 + 2s);
  EXPECT_TRUE(traffic.busy());
}

}  // namespace
}  // namespace ferry::fabric_link
