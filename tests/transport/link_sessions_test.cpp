#include "transport/fabric/link_sessions.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

namespace ferry::fabric_link {
namespace {

job_secret secret_of(std::string_view text) {
  job_secret s(text.size());
  std::memcpy(s.data(), text.data(), text.size());
  return s;
}

const job_secret secret = secret_of("a job secret of enough bytes");
const std::vector<std::byte> endpoint_name(24, std::byte{7});

struct node {
  node_id id;
  link_sessions sessions;
  node(node_id i, const job_secret& s) : id(i), sessions(s, i) {}
};

/// Runs `client`'s handshake with `server` step by step, as the transport carries it; true when
/// both ends hold a proven link.
bool handshake(node& client, node& server) {
  const auto hello = client.sessions.open(server.id, endpoint_name);
  if (!hello) return false;
  const auto h = parse_handshake(*hello);
  if (!h || !server.sessions.may_answer(client.id)) return false;
  const auto challenge_body = server.sessions.challenge(client.id, h->client_nonce);
  const auto challenge = parse_handshake(challenge_body);
  auto answer = client.sessions.on_challenge(server.id, *challenge);
  if (answer.verdict != link_sessions::answer::verdict::proof) return false;
  client.sessions.proof_taken(server.id);
  return server.sessions.on_proof(client.id, *parse_handshake(answer.proof)) ==
         link_sessions::proof_verdict::proven;
}

/// A frame message from `from` carrying `body`, with room for its seal.
std::vector<std::byte> message(node_id from, std::string_view body) {
  std::vector<std::byte> m(message_overhead + seal_bytes + body.size());
  put_be32(m.data(), from);
  std::memcpy(m.data() + frame_prefix_bytes, body.data(), body.size());
  put_be32(m.data() + m.size() - trailer_bytes, make_trailer(message_kind::frame, body.size()));
  return m;
}

std::vector<std::byte> sealed_message(node& from, node_id to, std::string_view body) {
  auto m = message(from.id, body);
  from.sessions.seal(to, m.data(), m.size());
  from.sessions.sealed_sent(to);
  return m;
}

TEST(link_sessions, a_proven_link_carries_sealed_messages_once_each) {
  node a(1, secret), b(2, secret);
  EXPECT_FALSE(a.sessions.ready(2));
  ASSERT_TRUE(handshake(a, b));
  EXPECT_TRUE(a.sessions.ready(2));
  const auto first = sealed_message(a, 2, "first");
  const auto second = sealed_message(a, 2, "second");
  EXPECT_TRUE(b.sessions.open_seal(1, first.data(), first.size()));
  EXPECT_TRUE(b.sessions.open_seal(1, second.data(), second.size()));
  EXPECT_FALSE(b.sessions.open_seal(1, first.data(), first.size())) << "a replay";
  EXPECT_FALSE(b.sessions.open_seal(1, second.data(), second.size())) << "a replay";
  auto tampered = sealed_message(a, 2, "third");
  tampered[frame_prefix_bytes] ^= std::byte{1};
  EXPECT_FALSE(b.sessions.open_seal(1, tampered.data(), tampered.size()));
  EXPECT_FALSE(a.sessions.open_seal(2, first.data(), first.size()))
      << "a link is one way: b proved nothing to a";
}

TEST(link_sessions, a_node_without_the_secret_is_found_out_at_either_end) {
  node a(1, secret), b(2, secret), stranger(3, secret_of("another secret, just as long"));
  // The stranger as client: the proof in b's challenge does not hold under its secret.
  const auto hello = stranger.sessions.open(2, endpoint_name);
  const auto challenge_body = b.sessions.challenge(3, parse_handshake(*hello)->client_nonce);
  const auto answer = stranger.sessions.on_challenge(2, *parse_handshake(challenge_body));
  EXPECT_EQ(answer.verdict, link_sessions::answer::verdict::wrong_secret);
  // The stranger as server: a finds its challenge's proof wrong.
  const auto a_hello = a.sessions.open(3, endpoint_name);
  const auto stranger_challenge =
      stranger.sessions.challenge(1, parse_handshake(*a_hello)->client_nonce);
  EXPECT_EQ(a.sessions.on_challenge(3, *parse_handshake(stranger_challenge)).verdict,
            link_sessions::answer::verdict::wrong_secret);
  EXPECT_FALSE(a.sessions.ready(3));
  // A forged message claiming to be from a reaches b, which proved no link with anyone yet.
  auto forged = message(1, "forged");
  EXPECT_FALSE(b.sessions.open_seal(1, forged.data(), forged.size()));
}

TEST(link_sessions, steps_out_of_turn_are_unexpected) {
  node a(1, secret), b(2, secret);
  const auto hello = parse_handshake(*a.sessions.open(2, endpoint_name));
  EXPECT_FALSE(a.sessions.open(2, endpoint_name)) << "one handshake at a time";
  const auto challenge_body = b.sessions.challenge(1, hello->client_nonce);
  auto challenge = *parse_handshake(challenge_body);
  challenge.client_nonce[0] ^= std::byte{1};
  EXPECT_EQ(a.sessions.on_challenge(2, challenge).verdict,
            link_sessions::answer::verdict::unexpected);
  EXPECT_EQ(b.sessions.on_proof(3, handshake_message{.step = handshake_step::proof}),
            link_sessions::proof_verdict::unexpected)
      << "no handshake with node 3 is under way";
}

TEST(link_sessions, at_most_64_handshakes_are_answered_at_once) {
  node server(1000, secret);
  for (node_id id = 1; id <= link_sessions::max_pending_handshakes; ++id) {
    ASSERT_TRUE(server.sessions.may_answer(id));
    server.sessions.challenge(id, make_link_nonce());
  }
  EXPECT_FALSE(server.sessions.may_answer(999));
  EXPECT_TRUE(server.sessions.may_answer(5))
      << "a node whose handshake is under way may start again";
  server.sessions.drop_pending(5);
  EXPECT_TRUE(server.sessions.may_answer(999));
}

TEST(link_sessions, a_proven_link_outlives_a_dropped_handshake) {
  node a(1, secret), b(2, secret);
  ASSERT_TRUE(handshake(a, b));
  b.sessions.drop_pending(1);
  const auto m = sealed_message(a, 2, "still heard");
  EXPECT_TRUE(b.sessions.open_seal(1, m.data(), m.size()));
  a.sessions.close(2);
  EXPECT_FALSE(a.sessions.ready(2));
  ASSERT_TRUE(handshake(a, b)) << "a closed link is proven again";
  const auto after = sealed_message(a, 2, "after");
  EXPECT_TRUE(b.sessions.open_seal(1, after.data(), after.size()));
  EXPECT_FALSE(b.sessions.open_seal(1, m.data(), m.size()))
      << "the old link's messages are not the new one's";
}

/// Sealed messages through a wire that drops, duplicates, swaps neighbours and flips bytes, from
/// a seed: the receiver takes exactly the intact messages newer than the last it took.
TEST(link_sessions, a_faulty_wire_never_gets_a_damaged_or_replayed_message_through) {
  for (std::uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 random(seed);
    auto chance = [&](int percent) { return static_cast<int>(random() % 100) < percent; };
    node a(1, secret), b(2, secret);
    ASSERT_TRUE(handshake(a, b));
    struct on_wire {
      int index;
      bool damaged;
      std::vector<std::byte> bytes;
    };
    std::vector<on_wire> wire;
    for (int i = 0; i < 40; ++i) {
      auto m = sealed_message(a, 2, "message " + std::to_string(i));
      if (chance(10)) continue;  // dropped
      const bool damaged = chance(10);
      if (damaged)
        m[random() % m.size()] ^= std::byte{static_cast<unsigned char>(1 + random() % 255)};
      wire.push_back({i, damaged, m});
      if (chance(10)) wire.push_back(wire.back());  // duplicated
      if (wire.size() >= 2 && chance(10)) std::swap(wire[wire.size() - 1], wire[wire.size() - 2]);
    }
    int newest = -1;
    for (const auto& m : wire) {
      const bool expected = !m.damaged && m.index > newest;
      ASSERT_EQ(b.sessions.open_seal(1, m.bytes.data(), m.bytes.size()), expected)
          << "message " << m.index;
      if (expected) newest = m.index;
    }
  }
}

}  // namespace
}  // namespace ferry::fabric_link
