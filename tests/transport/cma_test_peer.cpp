/// The child of cma_two_process_test: a receiving node over the cma transport in a process of
/// its own. It offers a zeroed region, checks every write that lands against the test pattern
/// (`landed`), answers `inspect` about any range, and exits on `bye`.
/// Usage: cma_test_peer PARENT_ADDRESS PARENT_NODE SELF_NODE BYTES (secret from FERRY_SECRET,
/// copy threads from CMA_TEST_COPY_THREADS when set).
#include <algorithm>
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
    std::fprintf(stderr, "cma_test_peer: no job secret in the environment\n");
    return 2;
  }
  const auto registry = test::test_registry();
  event_loop loop;
  real_environment env(loop);
  tcp_options options;
  options.secret = *secret;
  options.same_host_copy = true;
  // The receiver copies: the parent may ask for another pool size to compare (timing only).
  if (const char* threads = std::getenv("CMA_TEST_COPY_THREADS"))
    options.copy_threads = static_cast<unsigned>(std::stoul(threads));
  auto transport = tcp_transport::make(loop, self, options);
  node n(env, self, transport, registry);
  if (auto ec = n.start()) {
    std::fprintf(stderr, "cma_test_peer: start: %s\n", ec.message().c_str());
    return 2;
  }
  if (transport->add_peer(parent, parent_address)) {
    std::fprintf(stderr, "cma_test_peer: bad parent address %s\n", parent_address.c_str());
    return 2;
  }

  std::vector<std::byte> region(bytes);
  const auto desc = transport->register_region(region);
  if (!desc) return 2;

  actor peer(n, 1);
  bool done = false, parent_lost = false;
  n.on_write(test::test_write_tag, [&](const write_notice& w) {
    // The parent writes bytes [offset, offset + length) of a patterned source to `offset`.
    const auto landed = std::span<const std::byte>(region).subspan(w.offset, w.length);
    peer.send(address{parent, 1},
              test::landed{.offset = w.offset,
                           .length = w.length,
                           .imm = w.imm,
                           .mismatched_words = test::pattern_mismatches(landed, w.offset / 8)});
  });
  peer.on<test::inspect>([&](const envelope_header& h, const test::inspect& q) {
    test::region_report r{.offset = q.offset, .length = q.length};
    if (q.offset <= region.size() && q.length <= region.size() - q.offset) {
      const auto range = std::span<const std::byte>(region).subspan(q.offset, q.length);
      r.nonzero_bytes = static_cast<std::uint64_t>(
          std::count_if(range.begin(), range.end(), [](std::byte b) { return b != std::byte{0}; }));
    }
    peer.send(h.from, r);
  });
  peer.on<test::bye>([&](const envelope_header&, const test::bye&) { done = true; });
  n.on_peer_lost([&](node_id who, std::error_code) { parent_lost = parent_lost || who == parent; });
  peer.start();
  peer.send(address{parent, 1},
            test::peer_hello{.address = transport->local_address(), .region = *desc});

  // A child that loses its parent must not linger.
  bool expired = false;
  n.clock().async_wait(std::chrono::seconds(150), [&](std::error_code ec) { expired = !ec; });
  loop.run_until([&] { return done || expired || parent_lost; });
  if (!done) {
    std::fprintf(stderr, "cma_test_peer: %s\n", expired ? "timed out" : "lost the parent");
    return 3;
  }
  peer.stop();
  loop.run_until([&] { return peer.finished(); });
  return 0;
}
