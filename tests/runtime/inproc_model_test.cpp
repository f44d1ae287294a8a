/// inproc's modelled frames (what `ferry sim` runs on): a large frame takes the model's time, a
/// node takes large frames one at a time, and a small frame never overtakes a large one sent before
/// it on the same link; as frames, and as messages handed over whole, sized as their frames.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "runtime/actor.hpp"
#include "runtime/messages.hpp"
#include "runtime/node.hpp"
#include "runtime/virtual_environment.hpp"
#include "transport/inproc/inproc_transport.hpp"

namespace ferry {
namespace {

/// Each ping as it lands: its nonce and the virtual moment.
class listener : public actor {
 public:
  listener(node& n, actor_id id) : actor(n, id) {
    on<ping>([this](const envelope_header&, const ping& p) {
      landed.push_back({p.nonce, host().clock().now().time_since_epoch()});
    });
  }
  std::vector<std::pair<std::uint64_t, clock::duration>> landed;
};

class inproc_model : public ::testing::TestWithParam<bool> {};

TEST_P(inproc_model, large_frames_reach_a_node_one_at_a_time_and_small_ones_never_overtake) {
  const message_registry registry = runtime_messages();
  event_loop loop;
  virtual_environment env{loop};
  inproc_network network;
  constexpr std::uint64_t large = 1 << 20;
  const auto cost = std::chrono::milliseconds(10);  // per large frame, whatever its sender
  network.model_frames_from(large);
  if (GetParam()) network.hand_over_messages();
  network.model_bulk([&](node_id, node_id, std::uint64_t, const std::byte*, const std::byte*,
                         std::function<void()> landed) {
    env.clock().async_wait(cost, [landed = std::move(landed)](std::error_code) { landed(); });
  });
  node a{env, 1, inproc_transport::make(env, network, 1), registry};
  node b{env, 2, inproc_transport::make(env, network, 2), registry};
  node c{env, 3, inproc_transport::make(env, network, 3), registry};
  for (auto* n : {&a, &b, &c}) ASSERT_FALSE(n->start());
  for (node_id id : {1, 2}) ASSERT_FALSE(network.find(id)->add_peer(3, "3"));
  listener to(c, 1);
  actor from_a(a, 1), from_b(b, 1);
  for (auto* x : {static_cast<actor*>(&to), &from_a, &from_b}) x->start();

  const std::string big(large, 'x');
  from_a.send({3, 1}, ping{.nonce = 1, .payload = big});
  from_b.send({3, 1}, ping{.nonce = 2, .payload = big});
  from_a.send({3, 1}, ping{.nonce = 3, .payload = "small"});  // behind a's large frame
  from_b.send({3, 1}, ping{.nonce = 4, .payload = "small"});  // behind b's
  loop.run_until([&] {
    return to.landed.size() == 4 || env.clock().now().time_since_epoch() > std::chrono::seconds(1);
  });

  ASSERT_EQ(to.landed.size(), 4u);
  // a's large frame lands after one cost, b's after two: c took them in turn, not side by side.
  // Each small frame lands with or after its sender's large one.
  std::map<std::uint64_t, clock::duration> at;
  for (const auto& [nonce, when] : to.landed) at[nonce] = when;
  EXPECT_EQ(at[1], cost);
  EXPECT_EQ(at[2], 2 * cost);
  EXPECT_GE(at[3], at[1]);
  EXPECT_GE(at[4], at[2]);
  EXPECT_LT(std::find_if(to.landed.begin(), to.landed.end(), [](auto& e) { return e.first == 1; }),
            std::find_if(to.landed.begin(), to.landed.end(), [](auto& e) { return e.first == 3; }));
  EXPECT_LT(std::find_if(to.landed.begin(), to.landed.end(), [](auto& e) { return e.first == 2; }),
            std::find_if(to.landed.begin(), to.landed.end(), [](auto& e) { return e.first == 4; }));
}

INSTANTIATE_TEST_SUITE_P(as, inproc_model, ::testing::Values(false, true),
                         [](const auto& test) { return test.param ? "handed_over" : "frames"; });

}  // namespace
}  // namespace ferry
