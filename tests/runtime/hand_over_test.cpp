/// inproc's messages handed over as objects (what `ferry sim` runs on): they arrive as sent, in
/// order; a body sent to many, or a shared vector of any size, is one object for all; the receiver
/// still checks kind, sender and actor; and a large message, or one its own check refuses, goes as
/// a frame, decoded as over any transport.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/actor.hpp"
#include "runtime/messages.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {
namespace {

/// A message with a check of its own, unknown to the runtime's registry.
struct reading {
  static constexpr msg_kind kind{900};
  double seconds = 0;
  bool valid() const { return seconds >= 0; }
  FERRY_DEFINE_MAP(seconds)
};

/// A message whose bulk is shared (a registration's table).
struct named_table {
  static constexpr msg_kind kind{901};
  shared_vector<std::string> names;
  FERRY_DEFINE_MAP(names)
};

struct handing_over : ::testing::Test {
  message_registry registry = [] {
    auto r = runtime_messages();
    r.add<reading>("reading");
    r.add<named_table>("named_table");
    return r;
  }();
  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  std::unique_ptr<node> a, b;
  void SetUp() override {
    network.hand_over_messages();
    a = std::make_unique<node>(env, 1, inproc_transport::make(env, network, 1), registry);
    b = std::make_unique<node>(env, 2, inproc_transport::make(env, network, 2), registry);
    ASSERT_FALSE(a->start());
    ASSERT_FALSE(b->start());
    ASSERT_TRUE(a->hands_over_messages());
  }
};

TEST_F(handing_over, messages_arrive_as_sent_and_in_order) {
  actor from(*a, 1), to(*b, 1);
  std::vector<std::uint64_t> nonces;
  std::vector<std::string> payloads;
  to.on<ping>([&](const envelope_header& h, const ping& p) {
    EXPECT_EQ(h.from, from.self());
    EXPECT_EQ(h.kind, ping::kind);
    nonces.push_back(p.nonce);
    payloads.push_back(p.payload);
  });
  from.start();
  to.start();
  std::vector<std::uint64_t> expected;
  for (std::uint64_t n = 1; n <= 50; ++n) {
    from.send(to.self(), ping{.nonce = n, .payload = std::string(n, 'a' + n % 26)});
    expected.push_back(n);
  }
  bool sent = false;
  from.send(to.self(), ping{.nonce = 51}, [&](std::error_code ec) { sent = !ec; });
  expected.push_back(51);
  loop.run_until([&] { return nonces.size() == expected.size(); });
  EXPECT_EQ(nonces, expected);
  for (std::size_t i = 0; i < 50; ++i)
    EXPECT_EQ(payloads[i], std::string(i + 1, 'a' + (i + 1) % 26));
  loop.run_until([&] { return sent; });
  EXPECT_EQ(b->stats().delivered, 51u);
  EXPECT_EQ(b->stats().rejected_total(), 0u);
}

TEST_F(handing_over, a_body_encoded_for_many_is_one_object_for_all) {
  actor from(*a, 1), first(*b, 1), second(*b, 2);
  std::vector<const ping*> seen;
  for (auto* r : {&first, &second}) {
    r->on<ping>([&](const envelope_header&, const ping& p) {
      EXPECT_EQ(p.payload, "plan");
      seen.push_back(&p);
    });
    r->start();
  }
  from.start();
  const auto body = encode_body(ping{.nonce = 9, .payload = "plan"});
  for (auto* r : {&first, &second}) from.send(r->self(), body, nullptr);
  loop.run_until([&] { return seen.size() == 2; });
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[0], body.object.get());
}

TEST_F(handing_over, the_receiver_still_checks_kind_sender_and_actor) {
  message_registry runtime_only = runtime_messages();
  node c{env, 3, inproc_transport::make(env, network, 3), runtime_only};
  ASSERT_FALSE(c.start());
  actor from(*a, 1), to(c, 1);
  to.on<ping>([](const envelope_header&, const ping&) {});
  from.start();
  to.start();
  from.send(to.self(), reading{.seconds = 1});  // a kind node 3 does not know
  from.send(address{3, 99}, ping{});            // no such actor
  // Node 1 claims to be node 2.
  a->transport().async_hand_over(3,
                                 {.message = {{.kind = ping::kind, .from = {2, 1}, .to = to.self()},
                                              std::make_shared<const ping>()}},
                                 nullptr);
  from.send(to.self(), ping{.nonce = 1});
  loop.run_until([&] { return c.stats().frames_in == 4; });
  EXPECT_EQ(c.stats().rejected_for(errc::unknown_kind), 1u);
  EXPECT_EQ(c.stats().rejected_for(errc::unknown_actor), 1u);
  EXPECT_EQ(c.stats().rejected_for(errc::forged_sender), 1u);
  EXPECT_EQ(c.stats().delivered, 1u);
}

TEST_F(handing_over, a_message_its_own_check_refuses_goes_as_a_frame_and_is_rejected) {
  actor from(*a, 1), to(*b, 1);
  std::vector<double> got;
  to.on<reading>([&](const envelope_header&, const reading& r) { got.push_back(r.seconds); });
  from.start();
  to.start();
  from.send(to.self(), reading{.seconds = -1});
  from.send(to.self(), reading{.seconds = 2});
  loop.run_until([&] { return b->stats().frames_in == 2; });
  loop.run_until([&] { return got.size() == 1; });
  EXPECT_EQ(got, std::vector<double>{2});
  EXPECT_EQ(b->stats().rejected_for(errc::malformed_body), 1u);
}

TEST_F(handing_over, a_large_message_goes_as_a_frame_under_the_receivers_limits) {
  node c{env, 3, inproc_transport::make(env, network, 3), registry,
         codec_limits{.max_str = max_handed_over_bytes / 2}};
  ASSERT_FALSE(c.start());
  actor from(*a, 1), to(c, 1);
  std::vector<std::size_t> got;
  to.on<ping>([&](const envelope_header&, const ping& p) { got.push_back(p.payload.size()); });
  from.start();
  to.start();
  from.send(to.self(), ping{.payload = std::string(max_handed_over_bytes, 'x')});
  from.send(to.self(), ping{.payload = std::string(max_handed_over_bytes / 4, 'y')});
  loop.run_until([&] { return c.stats().frames_in == 2; });
  loop.run_until([&] { return got.size() == 1; });
  EXPECT_EQ(got, std::vector<std::size_t>{max_handed_over_bytes / 4});
  EXPECT_EQ(c.stats().rejected_total(), 1u);
}

TEST_F(handing_over, a_large_shared_vector_is_one_object_for_all) {
  actor from(*a, 1), first(*b, 1), second(*b, 2);
  const named_table sent{.names =
                             std::vector<std::string>(max_handed_over_bytes / 4, "layer.0.weight")};
  ASSERT_GT(frame_size({}, sent).bytes, 2 * max_handed_over_bytes);
  std::vector<bool> shared;
  for (auto* r : {&first, &second}) {
    r->on<named_table>([&](const envelope_header&, const named_table& m) {
      shared.push_back(m.names.same_object(sent.names));
    });
    r->start();
  }
  from.start();
  for (auto* r : {&first, &second}) from.send(r->self(), sent);
  loop.run_until([&] { return shared.size() == 2; });
  EXPECT_EQ(shared, (std::vector<bool>{true, true}));
}

TEST(frame_size, counts_what_encode_makes) {
  const envelope_header head{.from = {1, 2}, .to = {300, 70000}, .epoch = 5};
  for (const std::size_t n : {0, 1, 31, 32, 255, 256, 65535, 65536, 1 << 20}) {
    const ping p{.nonce = n * 977, .payload = std::string(n, 'x')};
    EXPECT_EQ(frame_size(head, p).bytes, encode(head, p).size()) << n;
    const auto body = encode_body(p);
    EXPECT_EQ(frame_size(head, body).bytes, encode(head, body).size()) << n;
    EXPECT_EQ(frame_size(head, body).shared_bytes, body.bytes.size()) << n;
  }
}

}  // namespace
}  // namespace ferry
