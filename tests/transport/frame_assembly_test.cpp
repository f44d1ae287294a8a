#include "transport/fabric/frame_assembly.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ferry::fabric_link {
namespace {

using state = frame_assembly::piece_state;

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span(s));
}

std::string text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

TEST(frame_assembly, a_frame_in_one_piece_is_the_piece_itself) {
  frame_assembly assembly(64);
  const std::string piece = "whole";
  const auto made = assembly.add(1, bytes(piece), true);
  ASSERT_EQ(made.state, state::whole);
  EXPECT_EQ(made.frame.data(), bytes(piece).data()) << "no copy";
}

TEST(frame_assembly, pieces_of_two_senders_make_two_frames) {
  frame_assembly assembly(64);
  EXPECT_EQ(assembly.add(1, bytes("one-"), false).state, state::more);
  EXPECT_EQ(assembly.add(2, bytes("two-"), false).state, state::more);
  EXPECT_EQ(assembly.add(1, bytes("a-"), false).state, state::more);
  const auto two = assembly.add(2, bytes("b"), true);
  ASSERT_EQ(two.state, state::whole);
  EXPECT_EQ(text(two.frame), "two-b");
  const auto one = assembly.add(1, bytes("c"), true);
  ASSERT_EQ(one.state, state::whole);
  EXPECT_EQ(text(one.frame), "one-a-c");
}

TEST(frame_assembly, a_frame_over_the_limit_is_dropped_to_its_last_piece_and_the_next_one_arrives) {
  frame_assembly assembly(8);
  EXPECT_EQ(assembly.add(1, bytes("12345"), false).state, state::more);
  EXPECT_EQ(assembly.add(1, bytes("6789"), false).state, state::over_limit);
  EXPECT_EQ(assembly.add(1, bytes("0"), false).state, state::more);
  EXPECT_EQ(assembly.add(1, bytes("end"), true).state, state::dropped);
  const auto next = assembly.add(1, bytes("next"), true);
  ASSERT_EQ(next.state, state::whole);
  EXPECT_EQ(text(next.frame), "next");
  EXPECT_EQ(assembly.add(1, bytes("1234"), false).state, state::more);
  EXPECT_EQ(assembly.add(1, bytes("56789"), true).state, state::over_limit)
      << "a last piece over the limit";
}

TEST(frame_assembly, a_forgotten_sender_starts_afresh) {
  frame_assembly assembly(64);
  assembly.add(1, bytes("stale-"), false);
  assembly.forget(1);
  EXPECT_EQ(text(assembly.add(1, bytes("fresh"), true).frame), "fresh");
}

}  // namespace
}  // namespace ferry::fabric_link
