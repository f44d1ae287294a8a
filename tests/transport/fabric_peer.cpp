/// The receiving process of the two-process fabric test: registers a region, tells the writer
/// (whose address is on the command line) its address and region in a control frame, waits for
/// every chunk's write notice, verifies every byte and sends the verdict back.
/// Usage: fabric_peer PROVIDER WRITER_ADDRESS BYTES SEED
#include <cstdio>
#include <cstdlib>
#include <msgpack.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/transport/fabric_test_util.hpp"
#include "transport/fabric/fabric_transport.hpp"

int main(int argc, char** argv) {
  using namespace ferry;
  using namespace ferry::fabric_test;
  if (argc != 5) {
    std::fprintf(stderr, "usage: fabric_peer PROVIDER WRITER_ADDRESS BYTES SEED\n");
    return 2;
  }
  const std::string provider = argv[1];
  const std::string writer_address = argv[2];
  const std::size_t total = std::strtoull(argv[3], nullptr, 10);
  const std::uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  constexpr std::size_t chunk = 16u << 20;
  constexpr node_id self = 2, writer = 1;

  event_loop loop;
  auto made = fabric_transport::make(loop, self, {.secret = test_secret(), .provider = provider});
  if (!made) {
    std::fprintf(stderr, "fabric_peer: %s\n", made.error().message().c_str());
    return 3;
  }
  auto t = *made;
  std::set<std::uint32_t> chunks;
  std::size_t bad_notices = 0;
  t->start({.on_frame = {},
            .on_write =
                [&](const write_notice& n) {
                  if (imm_tag(n.imm) != 4 || !chunks.insert(imm_value(n.imm)).second) ++bad_notices;
                },
            .on_peer_lost = {}});
  if (auto ec = t->add_peer(writer, writer_address)) {
    std::fprintf(stderr, "fabric_peer: add_peer: %s\n", ec.message().c_str());
    return 4;
  }
  std::vector<std::byte> dst(total);
  auto region = t->register_region(dst);
  if (!region) return 5;

  msgpack::sbuffer packed;
  msgpack::pack(packed, *region);
  const std::string hello = t->local_address() + " " + std::string(packed.data(), packed.size());
  bool sent = false;
  t->async_send(writer, text_frame(hello), [&](std::error_code ec) {
    if (ec) std::fprintf(stderr, "fabric_peer: hello: %s\n", ec.message().c_str());
    sent = true;
  });
  const std::size_t expected = (total + chunk - 1) / chunk;
  if (!run_for(
          loop, [&] { return chunks.size() == expected; }, std::chrono::seconds(90))) {
    std::fprintf(stderr, "fabric_peer: saw %zu of %zu chunks\n", chunks.size(), expected);
    return 6;
  }
  const std::size_t at = first_mismatch(dst, seed);
  const std::string verdict =
      (at == total && bad_notices == 0)
          ? "verified " + std::to_string(total)
          : "mismatch at " + std::to_string(at) + ", bad notices " + std::to_string(bad_notices);
  bool done = false;
  t->async_send(writer, text_frame(verdict), [&](std::error_code) { done = true; });
  run_for(
      loop, [&] { return done; }, std::chrono::seconds(10));
  // Stay until the writer had time to poll our verdict off its queue (rxm/shm are manual).
  run_for(
      loop, [] { return false; }, std::chrono::milliseconds(200));
  t->close();
  return at == total && bad_notices == 0 ? 0 : 1;
}
