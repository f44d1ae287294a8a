/// Writes the fuzzer's seed corpus: one valid frame per message kind (and a few shapes of the
/// header), so the fuzzer starts from every body schema instead of guessing msgpack maps.
/// Usage: ferry_fuzz_seeds DIR. Kinds registered without an example get an empty-body seed.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "protocol/protocol.hpp"
#include "runtime/codec.hpp"
#include "sample_messages.hpp"

namespace {

using namespace ferry;

bool write_seed(const std::filesystem::path& dir, const std::string& name, const frame& f) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "ferry_fuzz_seeds: cannot create %s: %s\n", argv[1], ec.message().c_str());
    return 1;
  }
  const auto& registry = protocol();
  std::set<msg_kind> seeded;
  bool ok = true;
  int written = 0;
  fuzz::for_each_message([&]<class M>(const M& m) {
    const auto* entry = registry.find(M::kind);
    const std::string name = entry ? entry->name : "unregistered";
    auto head = fuzz::sample_header();
    ok = write_seed(dir, "kind-" + std::to_string(M::kind) + "-" + name, encode(head, m)) && ok;
    // The same body under a header with large field values and another route.
    head = {.from = {0xffff'fffe, 7}, .to = {0, 0xffff'ffff}, .epoch = 0xffff'ffff};
    ok = write_seed(dir, "kind-" + std::to_string(M::kind) + "-" + name + "-wide",
                    encode(head, m)) &&
         ok;
    seeded.insert(M::kind);
    written += 2;
  });
  for (std::uint32_t k = 0; k <= 0xffff; ++k) {
    const auto kind = static_cast<msg_kind>(k);
    const auto* entry = registry.find(kind);
    if (!entry || seeded.contains(kind)) continue;
    std::fprintf(stderr, "ferry_fuzz_seeds: kind %u (%s) has no example; seeding an empty body\n",
                 k, entry->name.c_str());
    auto& buffer = detail::packing_buffer();
    msgpack::packer<detail::pack_buffer> packer(buffer);
    auto head = fuzz::sample_header();
    head.kind = kind;
    detail::pack_header(packer, head);
    packer.pack_map(0);
    const frame f = detail::framed(buffer.bytes());
    ok = write_seed(dir, "kind-" + std::to_string(k) + "-" + entry->name, f) && ok;
    ++written;
  }
  if (!ok) {
    std::fprintf(stderr, "ferry_fuzz_seeds: cannot write into %s\n", argv[1]);
    return 1;
  }
  std::printf("ferry_fuzz_seeds: %d seeds for %zu kinds in %s\n", written, registry.size(),
              argv[1]);
  return 0;
}
