/// The child of tcp_two_process_test: a node in a process of its own. It offers a region,
/// answers pings, checks every byte of the parent's bulk write and reports a verdict.
/// Usage: tcp_test_peer PARENT_ADDRESS PARENT_NODE SELF_NODE BYTES (secret from FERRY_SECRET).
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "platform/real_environment.hpp"
#include "runtime/actor.hpp"
#include "runtime/node.hpp"
#include "tcp_test_support.hpp"
#include "transport/tcp/tcp_transport.hpp"

using namespace ferry;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PARENT_ADDRESS PARENT_NODE SELF_NODE BYTES\n", argv[0]);
    return 2;
  }
  const std::string parent_address = argv[1];
  const auto parent = static_cast<node_id>(std::stoul(argv[2]));
  const auto self = static_cast<node_id>(std::stoul(argv[3]));
  const auto bytes = static_cast<std::size_t>(std::stoull(argv[4]));

  auto secret = load_job_secret();
  if (!secret || secret->empty()) {
    std::fprintf(stderr, "tcp_test_peer: no job secret in the environment\n");
    return 2;
  }
  const auto registry = test::test_registry();
  event_loop loop;
  real_environment env(loop);
  tcp_options options;
  options.secret = *secret;
  auto transport = tcp_transport::make(loop, self, options);
  node n(env, self, transport, registry);
  if (auto ec = n.start()) {
    std::fprintf(stderr, "tcp_test_peer: start: %s\n", ec.message().c_str());
    return 2;
  }
  if (auto ec = transport->add_peer(parent, parent_address)) {
    std::fprintf(stderr, "tcp_test_peer: bad parent address %s\n", parent_address.c_str());
    return 2;
  }

  std::vector<std::byte> region(bytes);
  const auto desc = transport->register_region(region);
  if (!desc) return 2;

  actor peer(n, 1);
  std::optional<write_notice> landed;
  std::optional<test::write_done> announced;
  bool verdict_sent = false, done = false, parent_lost = false;
  auto check = [&] {
    if (verdict_sent || !landed || !announced) return;
    test::verdict v;
    v.length = landed->length;
    v.hash = XXH3_64bits(region.data(), region.size());
    v.mismatched_words = test::pattern_mismatches(region);
    v.ok = landed->offset == 0 && landed->length == bytes && announced->length == bytes &&
           announced->hash == v.hash && v.mismatched_words == 0 &&
           landed->imm == make_imm(test::test_write_tag, 1);
    peer.send(address{parent, 1}, v);
    verdict_sent = true;
  };
  peer.on<ping>([&](const envelope_header& h, const ping& p) {
    peer.send(h.from, pong{.nonce = p.nonce, .payload = p.payload});
  });
  peer.on<test::write_done>([&](const envelope_header&, const test::write_done& w) {
    announced = w;
    check();
  });
  peer.on<test::bye>([&](const envelope_header&, const test::bye&) { done = true; });
  n.on_write(test::test_write_tag, [&](const write_notice& w) {
    landed = w;
    check();
  });
  n.on_peer_lost([&](node_id who, std::error_code) { parent_lost = parent_lost || who == parent; });
  peer.start();
  peer.send(address{parent, 1},
            test::peer_hello{.address = transport->local_address(), .region = *desc});

  // A child that loses its parent must not linger.
  bool expired = false;
  n.clock().async_wait(std::chrono::seconds(120), [&](std::error_code ec) { expired = !ec; });
  loop.run_until([&] { return done || expired || parent_lost; });
  if (!done) {
    std::fprintf(stderr, "tcp_test_peer: %s\n", expired ? "timed out" : "lost the parent");
    return 3;
  }
  peer.stop();
  loop.run_until([&] { return peer.finished(); });
  return 0;
}
