#include "transport/tcp/handshake_budget.hpp"

#include <gtest/gtest.h>

#include <set>

namespace ferry {
namespace {

using namespace std::chrono_literals;
using address = handshake_budget::address;

const address attacker = boost::asio::ip::make_address("127.0.0.2");
const address peer = boost::asio::ip::make_address("127.0.0.1");

/// A budget with the given limits, and which of its connections have spoken.
struct budget_fixture : ::testing::Test {
  handshake_budget budget{{.max_total = 6, .max_per_address = 3, .stale_after = 1000ms}};
  std::set<std::uint64_t> spoken;
  handshake_budget::time_point t0 = std::chrono::steady_clock::now();
  std::uint64_t next_id = 1;

  handshake_budget::verdict consider(const address& from,
                                     std::chrono::milliseconds at = 0ms) const {
    return budget.consider(from, t0 + at, [this](std::uint64_t id) { return spoken.contains(id); });
  }
  /// Admits a connection as the transport does (closing the victim first); its id, or 0 if refused.
  std::uint64_t connect(const address& from, std::chrono::milliseconds at = 0ms) {
    const auto v = consider(from, at);
    if (!v.admit) return 0;
    if (v.evict) budget.remove(*v.evict);
    budget.add(next_id, from, t0 + at);
    return next_id++;
  }
};

TEST_F(budget_fixture, admits_while_there_is_room) {
  for (int i = 0; i < 3; ++i) EXPECT_NE(connect(attacker), 0u);
  for (int i = 0; i < 3; ++i) EXPECT_NE(connect(peer), 0u);
  EXPECT_EQ(budget.size(), 6u);
  EXPECT_EQ(budget.count(attacker), 3u);
  EXPECT_EQ(budget.count(peer), 3u);
}

TEST_F(budget_fixture, one_address_gets_only_its_share_and_its_newest_replace_its_oldest_idle) {
  const auto first = connect(attacker);
  const auto second = connect(attacker);
  connect(attacker);
  // The fourth from the same address closes that address's oldest idle connection.
  const auto v = consider(attacker, 5ms);
  EXPECT_TRUE(v.admit);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(*v.evict, first);
  EXPECT_EQ(v.limit, "max_unauthenticated_per_address");
  connect(attacker, 5ms);
  EXPECT_EQ(budget.count(attacker), 3u);
  // ... and never more than its share, however many it opens: the rest of the budget stays free.
  for (int i = 0; i < 100; ++i) connect(attacker, 10ms);
  EXPECT_EQ(budget.count(attacker), 3u);
  EXPECT_EQ(budget.size(), 3u);
  EXPECT_EQ(consider(peer, 10ms).evict, std::nullopt);
  EXPECT_TRUE(consider(peer, 10ms).admit);
  (void)second;
}

TEST_F(budget_fixture, a_handshake_in_progress_is_not_closed_for_a_newcomer_of_its_address) {
  for (int i = 0; i < 3; ++i) spoken.insert(connect(peer));
  // Every connection of that address is handshaking (and young): the newcomer waits its turn.
  const auto v = consider(peer, 10ms);
  EXPECT_FALSE(v.admit);
  EXPECT_EQ(v.limit, "max_unauthenticated_per_address");
  EXPECT_FALSE(v.evict);
}

TEST_F(budget_fixture, a_handshake_running_too_long_is_closed_under_pressure) {
  const auto slow = connect(peer);
  spoken.insert(slow);
  spoken.insert(connect(peer, 500ms));
  spoken.insert(connect(peer, 500ms));
  EXPECT_FALSE(consider(peer, 999ms).admit);
  const auto v = consider(peer, 1000ms);  // `slow` has handshaked for stale_after
  EXPECT_TRUE(v.admit);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(*v.evict, slow);
}

TEST_F(budget_fixture, a_full_budget_takes_from_the_address_holding_most) {
  // Two flooding addresses fill the budget with idle connections; one real peer handshakes.
  const address other = boost::asio::ip::make_address("127.0.0.3");
  const auto real = connect(peer);
  connect(attacker, 1ms);
  connect(attacker, 2ms);
  connect(attacker, 3ms);
  const auto oldest_other = connect(other, 4ms);
  connect(other, 5ms);
  ASSERT_EQ(budget.size(), 6u);
  // The real peer's connection is the oldest and idle too, but its address holds only one.
  auto v = consider(peer, 10ms);
  EXPECT_TRUE(v.admit);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(budget.count(attacker), 3u);
  EXPECT_NE(*v.evict, real);
  EXPECT_EQ(v.limit, "max_unauthenticated");
  // A newcomer of a fourth address too takes from the greediest, oldest first.
  v = consider(boost::asio::ip::make_address("127.0.0.4"), 10ms);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(*v.evict, real + 1);
  // Two addresses holding two each: the older connection of theirs goes; the real peer's stays.
  budget.remove(real + 1);
  budget.add(100, boost::asio::ip::make_address("127.0.0.4"), t0 + 10ms);
  v = consider(boost::asio::ip::make_address("127.0.0.5"), 10ms);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(*v.evict, real + 2);
  budget.remove(real + 2);
  budget.remove(real + 3);
  budget.add(101, boost::asio::ip::make_address("127.0.0.5"), t0 + 10ms);
  budget.add(102, boost::asio::ip::make_address("127.0.0.6"), t0 + 10ms);
  // Now `other` holds the most: its oldest goes.
  v = consider(boost::asio::ip::make_address("127.0.0.7"), 10ms);
  ASSERT_TRUE(v.evict);
  EXPECT_EQ(*v.evict, oldest_other);
}

TEST_F(budget_fixture, a_full_budget_of_handshakes_in_progress_refuses_the_newcomer) {
  for (int i = 0; i < 6; ++i) {
    spoken.insert(connect(boost::asio::ip::make_address("127.0.1." + std::to_string(i + 1))));
  }
  const auto v = consider(peer, 10ms);
  EXPECT_FALSE(v.admit);
  EXPECT_EQ(v.limit, "max_unauthenticated");
  // Once one of them finishes, there is room again.
  budget.remove(3);
  EXPECT_TRUE(consider(peer, 10ms).admit);
  EXPECT_FALSE(consider(peer, 10ms).evict);
}

TEST(handshake_budget, a_per_address_share_above_the_total_leaves_the_total_in_charge) {
  handshake_budget budget{{.max_total = 1, .max_per_address = 8, .stale_after = 1000ms}};
  const auto now = std::chrono::steady_clock::now();
  budget.add(1, peer, now);
  const auto v = budget.consider(peer, now, [](std::uint64_t) { return true; });
  EXPECT_FALSE(v.admit);
  EXPECT_EQ(v.limit, "max_unauthenticated");
  budget.remove(1);
  budget.remove(1);  // unknown ids are ignored
  EXPECT_EQ(budget.size(), 0u);
}

}  // namespace
}  // namespace ferry
