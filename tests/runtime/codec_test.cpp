#include "runtime/codec.hpp"

#include <gtest/gtest.h>

#include <array>

#include "runtime/messages.hpp"

namespace ferry {
namespace {

frame raw_frame(const msgpack::sbuffer& payload) {
  frame f(frame_prefix_bytes);
  const auto* p = reinterpret_cast<const std::byte*>(payload.data());
  f.insert(f.end(), p, p + payload.size());
  detail::finish_prefix(f);
  return f;
}

/// An envelope packed by hand, so each field can be made wrong on purpose.
template <class Body>
frame hand_packed(std::uint16_t protocol, std::uint16_t kind, const Body& body) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_array(6);
  p.pack(protocol);
  p.pack(kind);
  p.pack(address{1, 2});
  p.pack(address{3, 4});
  p.pack(std::uint32_t{5});
  p.pack(body);
  return raw_frame(b);
}

TEST(codec, round_trip_keeps_header_and_body) {
  const auto registry = runtime_messages();
  const ping sent{.nonce = 0xfeedfacecafebeefull, .payload = std::string("\0\x01weights", 9)};
  const auto f = encode(envelope_header{.from = {7, 8}, .to = {9, 10}, .epoch = 11}, sent);

  auto m = decode_frame(f, registry, {});
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ(m->head.protocol, protocol_version);
  EXPECT_EQ(m->head.kind, ping::kind);
  EXPECT_EQ(m->head.from, (address{7, 8}));
  EXPECT_EQ(m->head.to, (address{9, 10}));
  EXPECT_EQ(m->head.epoch, 11u);
  const auto got = m->as<ping>();
  EXPECT_EQ(got.nonce, sent.nonce);
  EXPECT_EQ(got.payload, sent.payload);
}

TEST(codec, prefix_is_big_endian_payload_length) {
  const auto f = encode(envelope_header{}, pong{.nonce = 1});
  const auto n = decode_prefix(f, {});
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, f.size() - frame_prefix_bytes);
  EXPECT_EQ(std::to_integer<int>(f[0]), 0);
}

TEST(codec, rejects_truncated_frame) {
  const auto registry = runtime_messages();
  auto f = encode(envelope_header{}, ping{.nonce = 3, .payload = "abcdef"});
  f.resize(f.size() - 3);
  EXPECT_EQ(decode_frame(f, registry, {}).error(), errc::truncated_frame);
  EXPECT_EQ(decode_frame(std::span(f).first(2), registry, {}).error(), errc::truncated_frame);
  // A payload cut short inside msgpack is truncated too.
  EXPECT_EQ(decode_payload(std::span(f).subspan(4, 6), registry, {}).error(),
            errc::truncated_frame);
}

TEST(codec, rejects_oversize_frame_before_reading_it) {
  const auto registry = runtime_messages();
  codec_limits limits;
  limits.max_frame_bytes = 64;
  const auto f = encode(envelope_header{}, ping{.payload = std::string(100, 'x')});
  EXPECT_EQ(decode_prefix(f, limits).error(), errc::oversize_frame);
  EXPECT_EQ(decode_frame(f, registry, limits).error(), errc::oversize_frame);
  // A lying prefix of 4 GiB is refused from its four bytes alone.
  const frame huge{std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0xff}};
  EXPECT_EQ(decode_prefix(huge, {}).error(), errc::oversize_frame);
}

TEST(codec, rejects_unknown_kind) {
  const auto registry = runtime_messages();
  std::map<std::string, int> body{{"x", 1}};
  EXPECT_EQ(decode_frame(hand_packed(protocol_version, 999, body), registry, {}).error(),
            errc::unknown_kind);
}

TEST(codec, rejects_wrong_protocol_version) {
  const auto registry = runtime_messages();
  EXPECT_EQ(
      decode_frame(hand_packed(protocol_version + 1, ping::kind, ping{}), registry, {}).error(),
      errc::wrong_protocol);
}

TEST(codec, rejects_body_of_the_wrong_shape) {
  const auto registry = runtime_messages();
  // nonce must be an integer.
  std::map<std::string, std::string> wrong_types{{"nonce", "not a number"}};
  EXPECT_EQ(
      decode_frame(hand_packed(protocol_version, ping::kind, wrong_types), registry, {}).error(),
      errc::malformed_body);
  // A body must be a map.
  EXPECT_EQ(decode_frame(hand_packed(protocol_version, ping::kind, 42), registry, {}).error(),
            errc::malformed_body);
}

TEST(codec, rejects_malformed_envelopes) {
  const auto registry = runtime_messages();
  msgpack::sbuffer not_an_array;
  msgpack::pack(not_an_array, std::string("hello"));
  EXPECT_EQ(decode_frame(raw_frame(not_an_array), registry, {}).error(), errc::malformed_frame);

  msgpack::sbuffer short_array;
  msgpack::pack(short_array, std::vector<int>{1, 1});
  EXPECT_EQ(decode_frame(raw_frame(short_array), registry, {}).error(), errc::malformed_frame);

  msgpack::sbuffer negative_epoch;
  msgpack::packer<msgpack::sbuffer> p(negative_epoch);
  p.pack_array(6);
  p.pack(protocol_version);
  p.pack(ping::kind);
  p.pack(address{});
  p.pack(address{});
  p.pack(-1);
  p.pack(ping{});
  EXPECT_EQ(decode_frame(raw_frame(negative_epoch), registry, {}).error(), errc::malformed_frame);

  const frame garbage_payload{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{1},
                              std::byte{0xc1}};
  EXPECT_EQ(decode_frame(garbage_payload, registry, {}).error(), errc::malformed_frame);

  auto trailing = encode(envelope_header{}, ping{});
  trailing.push_back(std::byte{0});
  EXPECT_EQ(decode_frame(trailing, registry, {}).error(), errc::malformed_frame);
}

TEST(codec, rejects_nesting_deeper_than_the_cap) {
  const auto registry = runtime_messages();
  msgpack::sbuffer bomb;
  msgpack::packer<msgpack::sbuffer> p(bomb);
  for (int i = 0; i < 10000; ++i) p.pack_array(1);
  p.pack(0);
  EXPECT_EQ(decode_frame(raw_frame(bomb), registry, {}).error(), errc::malformed_frame);
}

TEST(codec, rejects_a_huge_declared_array_without_allocating_it) {
  const auto registry = runtime_messages();
  // array32 header announcing 4 billion elements, then nothing.
  msgpack::sbuffer b;
  const char header[] = {'\xdd', '\xff', '\xff', '\xff', '\xff'};
  b.write(header, sizeof header);
  const auto result = decode_frame(raw_frame(b), registry, {});
  ASSERT_FALSE(result);
  EXPECT_TRUE(result.error() == errc::malformed_frame || result.error() == errc::truncated_frame);
}

TEST(codec, a_body_encoded_once_frames_as_the_message_would) {
  const auto registry = runtime_messages();
  codec_limits limits;
  limits.max_str = 4u << 20;
  const ping big{.nonce = 1, .payload = std::string(2u << 20, 'w')};
  const auto body = encode_body(big);
  const envelope_header to_a{.from = {1, 1}, .to = {2, 1}, .epoch = 3},
      to_b{.from = {1, 1}, .to = {3, 1}, .epoch = 3};
  EXPECT_EQ(encode(to_a, body), encode(to_a, big));
  EXPECT_EQ(encode(to_b, body), encode(to_b, big));
  const auto fb = encode(to_b, body);
  auto b = decode_payload(std::span(fb).subspan(frame_prefix_bytes), registry, limits);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->head.to, to_b.to);
  EXPECT_EQ(b->as<ping>().payload, big.payload);
  EXPECT_THROW((void)b->as<pong>(), std::logic_error);
}

}  // namespace
}  // namespace ferry
