#include "transport/fabric/message_format.hpp"

#include <gtest/gtest.h>

namespace ferry::fabric_link {
namespace {

TEST(fabric_message_format, a_trailer_holds_kind_and_length) {
  const auto trailer = make_trailer(message_kind::notice, 20);
  EXPECT_EQ(kind_of(trailer), message_kind::notice);
  EXPECT_EQ(trailer & length_mask, 20u);
  std::byte be[4];
  put_be32(be, 0x01020304);
  EXPECT_EQ(be[0], std::byte{1});
  EXPECT_EQ(be[3], std::byte{4});
}

TEST(fabric_message_format, a_notice_round_trips_and_a_short_one_is_refused) {
  std::byte at[notice_bytes];
  encode_notice(at, {.address = 0x1122334455667788, .length = 1u << 30, .imm = 0xdeadbeef});
  const auto n = parse_notice(at);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->address, 0x1122334455667788u);
  EXPECT_EQ(n->length, 1u << 30);
  EXPECT_EQ(n->imm, 0xdeadbeefu);
  EXPECT_FALSE(parse_notice(std::span(at, notice_bytes - 1)));
}

TEST(fabric_message_format, handshake_steps_round_trip_and_wrong_sizes_are_refused) {
  const auto client = make_link_nonce();
  const auto server = make_link_nonce();
  const link_proof proof = make_link_nonce();
  const std::vector<std::byte> name(40, std::byte{9});
  const auto hello = parse_handshake(encode_hello(client, name));
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->step, handshake_step::hello);
  EXPECT_EQ(hello->client_nonce, client);
  EXPECT_TRUE(std::ranges::equal(hello->name, name));
  const auto challenge_body = encode_challenge(client, server, proof);
  const auto challenge = parse_handshake(challenge_body);
  ASSERT_TRUE(challenge);
  EXPECT_EQ(challenge->server_nonce, server);
  EXPECT_EQ(challenge->proof, proof);
  auto short_challenge = challenge_body;
  short_challenge.pop_back();
  EXPECT_FALSE(parse_handshake(short_challenge));
  EXPECT_FALSE(parse_handshake(encode_hello(client, std::vector<std::byte>(max_name_bytes + 1))));
  EXPECT_FALSE(parse_handshake(encode_hello(client, {}))) << "a hello names where to answer";
  auto unknown = encode_proof(server, proof);
  unknown[0] = std::byte{9};
  EXPECT_FALSE(parse_handshake(unknown));
  EXPECT_FALSE(parse_handshake({}));
}

TEST(fabric_message_format, hex_round_trips_and_refuses_what_is_not_an_endpoint_name) {
  const std::vector<std::byte> name{std::byte{0}, std::byte{0xab}, std::byte{0xff}};
  EXPECT_EQ(hex_encode(name), "00abff");
  EXPECT_EQ(*hex_decode("00ABff"), name);
  for (const auto* bad : {"", "abc", "zz", std::string(1026, 'a').c_str()})
    EXPECT_FALSE(hex_decode(bad)) << bad;
}

}  // namespace
}  // namespace ferry::fabric_link
