#include <gtest/gtest.h>

#include <thread>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/errc.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry {
namespace {

using test::raw_frame;
using test::raw_peer;
namespace wire = tcp_link;

class echo : public actor {
 public:
  echo(node& n, actor_id id) : actor(n, id) {
    on<ping>([this](const envelope_header& h, const ping& p) {
      send(h.from, pong{.nonce = p.nonce, .payload = p.payload});
    });
  }
};

/// What the hand-driven attacker saw, step by step.
struct attack_log {
  bool garbage_before_handshake_dropped = false;
  bool handshakes_ok = true;
  bool unknown_type_dropped = false;
  bool lying_length_dropped = false;
  bool bad_write_header_dropped = false;
  bool ack_on_incoming_dropped = false;
  bool truncated_frame_closed = false;
  bool bad_envelopes_sent = false;
};

TEST(tcp_hostile_peer, garbage_peers_are_dropped_while_a_good_peer_is_served) {
  message_registry registry = test::test_registry();
  event_loop loop;
  real_environment env{loop};
  tcp_options o;
  o.secret = test::test_secret();
  auto ta = tcp_transport::make(loop, 1, o), tb = tcp_transport::make(loop, 2, o);
  node a{env, 1, ta, registry}, b{env, 2, tb, registry};
  ASSERT_FALSE(a.start());
  ASSERT_FALSE(b.start());
  ASSERT_FALSE(ta->add_peer(2, tb->local_address()));
  ASSERT_FALSE(tb->add_peer(1, ta->local_address()));
  std::vector<std::pair<node_id, std::error_code>> lost;
  b.on_peer_lost([&](node_id peer, std::error_code why) { lost.emplace_back(peer, why); });

  std::vector<std::byte> target(1 << 20);
  const auto region = *tb->register_region(target);

  // The good peer keeps a ping in flight for as long as the attack lasts, and 20 more after.
  echo server(b, 1);
  actor client(a, 1);
  bool attack_over = false;
  std::uint64_t answered = 0, after_attack = 0;
  client.on<pong>([&](const envelope_header&, const pong& p) {
    EXPECT_EQ(p.nonce, answered + 1);
    EXPECT_EQ(p.payload, "good " + std::to_string(p.nonce));
    ++answered;
    if (attack_over) ++after_attack;
    if (after_attack < 20)
      client.send(server.self(),
                  ping{.nonce = answered + 1, .payload = "good " + std::to_string(answered + 1)});
  });
  server.start();
  client.start();
  client.send(server.self(), ping{.nonce = 1, .payload = "good 1"});

  const auto port = test::port_of(tb->local_address());
  attack_log log;
  std::thread attacker([&] {
    const auto secret = test::test_secret();
    {
      raw_peer p(port);
      const std::string http = "GET / HTTP/1.1\r\nHost: ferry\r\n\r\n";
      p.send(std::as_bytes(std::span(http)));
      log.garbage_before_handshake_dropped = p.closed_by_peer();
    }
    {
      raw_peer p(port);
      log.handshakes_ok &= p.handshake(7, 2, secret);
      p.send(raw_frame(1, 0x7f));
      log.unknown_type_dropped = p.closed_by_peer();
    }
    {
      raw_peer p(port);
      log.handshakes_ok &= p.handshake(8, 2, secret);
      // A control frame announcing 4 GiB, far above max_frame_bytes.
      p.send(raw_frame(0xffffffffu, static_cast<std::uint8_t>(wire::frame_type::control),
                       std::vector<std::byte>(64)));
      log.lying_length_dropped = p.closed_by_peer();
    }
    {
      raw_peer p(port);
      log.handshakes_ok &= p.handshake(9, 2, secret);
      // A WRITE whose header is 3 bytes short, followed by bytes that must not land.
      std::vector<std::byte> body(wire::write_header_bytes - 3, std::byte{0});
      auto f = raw_frame(static_cast<std::uint32_t>(body.size() + 1),
                         static_cast<std::uint8_t>(wire::frame_type::write), body);
      f.insert(f.end(), 4096, std::byte{0xee});
      p.send(f);
      log.bad_write_header_dropped = p.closed_by_peer();
    }
    {
      raw_peer p(port);
      log.handshakes_ok &= p.handshake(10, 2, secret);
      // Acks only travel towards the writer: one sent to the listener is a violation.
      p.send(wire::encode(wire::write_ack{.id = 1, .status = 0}));
      log.ack_on_incoming_dropped = p.closed_by_peer();
    }
    {
      raw_peer p(port);
      log.handshakes_ok &= p.handshake(11, 2, secret);
      // Envelope-level garbage on a valid link: the node rejects the frames, the link stays.
      const std::vector<std::byte> junk{std::byte{0xc1}, std::byte{0xc1}};
      auto bad = raw_frame(3, static_cast<std::uint8_t>(wire::frame_type::control), junk);
      const auto forged = encode(envelope_header{.from = {1, 1}, .to = {2, 1}}, ping{.nonce = 666});
      auto f2 = wire::make_head(wire::frame_type::control, forged.size() - frame_prefix_bytes);
      bad.insert(bad.end(), f2.begin(), f2.end());
      bad.insert(bad.end(), forged.begin() + frame_prefix_bytes, forged.end());
      log.bad_envelopes_sent = p.send(bad);
      // Then half a frame, and hang up.
      p.send(raw_frame(100, static_cast<std::uint8_t>(wire::frame_type::control),
                       std::vector<std::byte>(10)));
      p.close();
      log.truncated_frame_closed = true;
    }
    loop.post([&] { attack_over = true; });
  });

  auto expired = std::make_shared<bool>(false);
  const auto timer = a.clock().async_wait(std::chrono::seconds(60),
                                          [expired](std::error_code ec) { *expired = !ec; });
  loop.run_until([&] {
    return *expired || (attack_over && after_attack >= 20 && b.stats().rejected_total() >= 2 &&
                        tb->stats().links_lost >= 5);
  });
  a.clock().cancel(timer);
  attacker.join();
  ASSERT_FALSE(*expired) << "timed out";

  EXPECT_TRUE(log.garbage_before_handshake_dropped);
  EXPECT_TRUE(log.handshakes_ok);
  EXPECT_TRUE(log.unknown_type_dropped);
  EXPECT_TRUE(log.lying_length_dropped);
  EXPECT_TRUE(log.bad_write_header_dropped);
  EXPECT_TRUE(log.ack_on_incoming_dropped);
  EXPECT_TRUE(log.bad_envelopes_sent);
  EXPECT_TRUE(log.truncated_frame_closed);

  // The good peer's round trips were all answered, in order, on links that never broke.
  EXPECT_GE(answered, 20u);
  EXPECT_EQ(ta->stats().links_lost, 0u);
  EXPECT_EQ(tb->stats().links_accepted, 6u);  // the good peer + five attacker links
  // One violation before the handshake, four after it.
  EXPECT_EQ(tb->stats().protocol_violations, 5u);
  EXPECT_EQ(tb->stats().handshakes_failed, 1u);
  EXPECT_EQ(tb->stats().links_lost, 5u);
  // Links that had authenticated are reported lost with the violation; the truncated one is not.
  std::vector<std::pair<node_id, std::error_code>> expected_lost;
  for (node_id n : {7u, 8u, 9u, 10u})
    expected_lost.emplace_back(n, transport_errc::protocol_violation);
  EXPECT_EQ(lost, expected_lost);
  // Envelope garbage on a valid link is the node's business: rejected and counted.
  EXPECT_EQ(b.stats().rejected_for(errc::malformed_frame), 1u);
  EXPECT_EQ(b.stats().rejected_for(errc::forged_sender), 1u);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_EQ(b.stats().writes_in, 0u);
  (void)region;
}

}  // namespace
}  // namespace ferry
