#include "transport/tcp/refusal_report.hpp"

#include <gtest/gtest.h>

namespace ferry {
namespace {

using namespace std::chrono_literals;

TEST(refusal_report, the_first_refusal_is_told_at_once) {
  refusal_report report;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(report.add("127.0.0.9", "unauthenticated: wrong proof", t0));
  EXPECT_EQ(report.take(t0),
            "turned away a connection from 127.0.0.9 before its handshake: unauthenticated: wrong "
            "proof");
  EXPECT_TRUE(report.empty());
  EXPECT_EQ(report.take(t0), "");
}

TEST(refusal_report, a_flood_costs_one_line_a_second_with_counts_per_source) {
  refusal_report report(1s, 2);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      report.add("127.0.0.2", "refused: limit max_unauthenticated_per_address reached", t0));
  report.take(t0);
  // 10,000 refusals in the next second: none is due before the second is over.
  std::size_t due = 0;
  for (int i = 0; i < 10000; ++i) {
    const auto at = t0 + std::chrono::microseconds(50 * i);
    due += report.add(
        i % 10 == 0 ? "127.0.0.3" : "127.0.0.2",
        i % 10 == 0 ? "timed out" : "refused: limit max_unauthenticated_per_address reached", at);
  }
  report.add("127.0.0.4", "timed out", t0 + 600ms);
  EXPECT_EQ(due, 0u);
  EXPECT_EQ(report.counted(), 10001u);
  EXPECT_EQ(report.due(), t0 + 1s);
  EXPECT_EQ(report.take(t0 + 1s),
            "turned away 10001 connections before their handshake in 1.0 s: 9000 from 127.0.0.2 "
            "(refused: limit max_unauthenticated_per_address reached); 1000 from 127.0.0.3 (timed "
            "out); 1 more from 1 source(s)");
  // The next line is due a second later again.
  EXPECT_FALSE(report.add("127.0.0.2", "timed out", t0 + 1500ms));
  EXPECT_TRUE(report.add("127.0.0.2", "timed out", t0 + 2s));
}

TEST(refusal_report, sources_past_the_kept_ones_are_summed_up) {
  refusal_report report(1s, 2, 3);
  const auto t0 = std::chrono::steady_clock::now();
  report.take(t0);
  for (int i = 0; i < 100; ++i) report.add("10.0.0." + std::to_string(i), "timed out", t0 + 1ms);
  const auto line = report.take(t0 + 1s);
  EXPECT_NE(line.find("turned away 100 connections"), std::string::npos) << line;
  EXPECT_NE(line.find("98 more from other sources"), std::string::npos) << line;
}

}  // namespace
}  // namespace ferry
