#include "runtime/actor.hpp"

#include <gtest/gtest.h>

#include <boost/fiber/operations.hpp>
#include <numeric>

#include "platform/real_environment.hpp"
#include "runtime/await.hpp"
#include "runtime/messages.hpp"
#include "runtime/node.hpp"
#include "transport/errc.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {
namespace {

/// Answers every ping with a pong carrying the same nonce and payload.
class echo : public actor {
 public:
  echo(node& n, actor_id id) : actor(n, id) {
    on<ping>([this](const envelope_header& h, const ping& p) {
      send(h.from, pong{.nonce = p.nonce, .payload = p.payload});
    });
  }
};

struct two_nodes : ::testing::Test {
  message_registry registry = runtime_messages();
  event_loop loop;
  real_environment env{loop};
  inproc_network network;
  node a{env, 1, inproc_transport::make(env, network, 1), registry};
  node b{env, 2, inproc_transport::make(env, network, 2), registry};
  void SetUp() override {
    ASSERT_FALSE(a.start());
    ASSERT_FALSE(b.start());
  }
};

TEST_F(two_nodes, actors_ping_pong_across_nodes) {
  echo server(b, 1);
  actor client(a, 1);
  std::vector<std::uint64_t> nonces;
  client.on<pong>([&](const envelope_header& h, const pong& p) {
    EXPECT_EQ(h.from, (address{2, 1}));
    EXPECT_EQ(p.payload, "round " + std::to_string(p.nonce));
    nonces.push_back(p.nonce);
    if (p.nonce < 100)
      client.send(server.self(),
                  ping{.nonce = p.nonce + 1, .payload = "round " + std::to_string(p.nonce + 1)});
  });
  server.start();
  client.start();
  client.send(server.self(), ping{.nonce = 1, .payload = "round 1"});
  loop.run_until([&] { return nonces.size() == 100; });
  std::vector<std::uint64_t> expected(100);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(nonces, expected);
  EXPECT_EQ(b.stats().delivered, 100u);
}

TEST_F(two_nodes, message_to_a_missing_actor_is_counted_not_fatal) {
  actor client(a, 1);
  echo server(b, 1);
  bool answered = false;
  client.on<pong>([&](const envelope_header&, const pong&) { answered = true; });
  client.start();
  server.start();
  client.send(address{2, 99}, ping{.nonce = 1});
  client.send(server.self(), ping{.nonce = 2});
  loop.run_until([&] { return answered; });
  EXPECT_EQ(b.stats().rejected_for(errc::unknown_actor), 1u);
}

TEST_F(two_nodes, garbage_frame_is_rejected_and_node_keeps_serving) {
  echo server(b, 1);
  actor client(a, 1);
  bool answered = false;
  client.on<pong>([&](const envelope_header&, const pong&) { answered = true; });
  server.start();
  client.start();
  frame garbage{std::byte{0},    std::byte{0},    std::byte{0},   std::byte{3},
                std::byte{0xc1}, std::byte{0xc1}, std::byte{0xc1}};
  a.transport().async_send(2, garbage, [](std::error_code) {});
  client.send(server.self(), ping{.nonce = 7});
  loop.run_until([&] { return answered; });
  EXPECT_EQ(b.stats().rejected_for(errc::malformed_frame), 1u);
}

TEST_F(two_nodes, forged_sender_is_rejected) {
  echo server(b, 1);
  server.start();
  // Node 1 claims to be node 3.
  a.transport().async_send(2, encode(envelope_header{.from = {3, 1}, .to = {2, 1}}, ping{}),
                           [](std::error_code) {});
  loop.run_until([&] { return b.stats().frames_in == 1; });
  EXPECT_EQ(b.stats().rejected_for(errc::forged_sender), 1u);
}

TEST_F(two_nodes, bulk_write_lands_bytes_and_notifies_both_sides) {
  std::vector<std::byte> source(1 << 20), target(2 << 20);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  auto local = a.transport().register_region(source);
  auto remote = b.transport().register_region(target);
  ASSERT_TRUE(local && remote);

  std::optional<write_notice> seen;
  b.on_write(7, [&](const write_notice& n) { seen = n; });
  std::optional<std::error_code> sender_done;
  a.transport().async_write(source, *remote, 4096, make_imm(7, 0xabcdef),
                            [&](std::error_code ec) { sender_done = ec; });
  loop.run_until([&] { return sender_done && seen; });

  EXPECT_FALSE(*sender_done);
  EXPECT_EQ(seen->from, 1u);
  EXPECT_EQ(seen->offset, 4096u);
  EXPECT_EQ(seen->length, source.size());
  EXPECT_EQ(seen->imm, make_imm(7, 0xabcdef));
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin() + 4096));
  EXPECT_EQ(target[0], std::byte{0});
}

TEST_F(two_nodes, bad_writes_are_refused_before_any_byte_lands) {
  std::vector<std::byte> source(4096, std::byte{0x5a}), target(8192);
  auto local = a.transport().register_region(source);
  auto remote = b.transport().register_region(target);
  ASSERT_TRUE(local && remote);

  auto write = [&](std::span<const std::byte> from, region_desc to, std::uint64_t offset) {
    std::optional<std::error_code> result;
    a.transport().async_write(from, to, offset, 0, [&](std::error_code ec) { result = ec; });
    loop.run_until([&] { return result.has_value(); });
    return *result;
  };
  auto wrong_key = *remote;
  wrong_key.key ^= 1;
  auto unknown = *remote;
  unknown.id += 100;
  std::vector<std::byte> unregistered(16);

  EXPECT_EQ(write(source, wrong_key, 0), transport_errc::key_mismatch);
  EXPECT_EQ(write(source, unknown, 0), transport_errc::unknown_region);
  EXPECT_EQ(write(source, *remote, 8192 - 100), transport_errc::out_of_bounds);
  EXPECT_EQ(write(unregistered, *remote, 0), transport_errc::not_registered);
  EXPECT_TRUE(
      std::all_of(target.begin(), target.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_FALSE(write(source, *remote, 4096));
  EXPECT_EQ(target[4096], std::byte{0x5a});
}

TEST_F(two_nodes, a_handler_that_never_suspends_keeps_the_mailbox_order) {
  actor sender(a, 1);
  actor receiver(b, 1);
  std::vector<std::string> order;
  bool released = false;
  loop_confined confined;
  boost::fibers::condition_variable_any release;
  boost::fibers::fiber::id mailbox_fiber, pong_fiber;
  receiver.on<ping>([&](const envelope_header&, const ping& p) {
    mailbox_fiber = boost::this_fiber::get_id();
    order.push_back("ping " + std::to_string(p.nonce) + " began");
    std::unique_lock lock(confined);
    release.wait(lock, [&] { return released; });
    order.push_back("ping ended");
  });
  receiver.on<pong>(
      [&](const envelope_header&, const pong& p) {
        order.push_back("pong " + std::to_string(p.nonce));
        pong_fiber = boost::this_fiber::get_id();
      },
      actor::handling::never_suspends);
  sender.start();
  receiver.start();
  sender.send(receiver.self(), ping{.nonce = 1});
  sender.send(receiver.self(), pong{.nonce = 2});
  sender.send(receiver.self(), pong{.nonce = 3});
  loop.run_until([&] { return b.stats().delivered == 3 && !order.empty(); });
  EXPECT_EQ(order,
            std::vector<std::string>{"ping 1 began"});  // the pongs wait behind the suspended ping
  released = true;
  release.notify_all();
  loop.run_until([&] { return order.size() == 4; });
  EXPECT_EQ(order, (std::vector<std::string>{"ping 1 began", "ping ended", "pong 2", "pong 3"}));
  EXPECT_EQ(pong_fiber, mailbox_fiber);

  // With the mailbox idle, a pong is handled where it arrives, off the mailbox fiber.
  sender.send(receiver.self(), pong{.nonce = 4});
  loop.run_until([&] { return order.size() == 5; });
  EXPECT_EQ(order.back(), "pong 4");
  EXPECT_NE(pong_fiber, mailbox_fiber);
}

/// A handler's exception stops the loop, which rethrows it, and its actor's mailbox fiber ends.
void expect_a_throwing_handler_fails_the_loop(two_nodes& t, actor::handling how) {
  actor sender(t.a, 1);
  actor receiver(t.b, 1);
  std::vector<boost::fibers::fiber::id> ran_on;  // per pong
  receiver.on<pong>(
      [&](const envelope_header&, const pong& p) {
        ran_on.push_back(boost::this_fiber::get_id());
        if (p.nonce == 2) throw std::runtime_error("pong 2 refused");
      },
      how);
  sender.start();
  receiver.start();
  sender.send(receiver.self(), pong{.nonce = 1});  // on the mailbox fiber, which then waits
  t.loop.run_until([&] { return ran_on.size() == 1; });
  sender.send(receiver.self(), pong{.nonce = 2});
  try {
    t.loop.run();
    ADD_FAILURE() << "the loop returned without the handler's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "pong 2 refused");
  }
  ASSERT_EQ(ran_on.size(), 2u);
  EXPECT_EQ(ran_on[1] == ran_on[0], how == actor::handling::may_suspend);  // the path under test
}  // ~actor returns only once the receiver's mailbox fiber has ended

TEST_F(two_nodes, a_handler_that_throws_on_the_mailbox_fiber_fails_the_loop) {
  expect_a_throwing_handler_fails_the_loop(*this, actor::handling::may_suspend);
}

TEST_F(two_nodes, a_handler_that_throws_at_once_fails_the_loop) {
  expect_a_throwing_handler_fails_the_loop(*this, actor::handling::never_suspends);
}

}  // namespace
}  // namespace ferry
