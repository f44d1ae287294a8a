#include "actors/plan_digest.hpp"

#include <xxhash.h>

#include <string_view>
#include <type_traits>

namespace ferry {
namespace {

/// xxh3-64 of the values `feed` passes to its argument (integers and strings).
template <class Feed>
std::uint64_t digest_of(Feed feed) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  auto add = [&](const auto& v) {
    if constexpr (std::is_convertible_v<decltype(v), std::string_view>) {
      const std::string_view text = v;
      XXH3_64bits_update(state, text.data(), text.size());
    } else {
      const auto n = static_cast<std::uint64_t>(v);
      XXH3_64bits_update(state, &n, sizeof n);
    }
  };
  feed(add);
  const auto digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace

std::uint64_t layout_digest(const plan& p) {
  return digest_of([&](auto add) {
    for (const auto& t : p.tensors) {
      add(t.name);
      add(static_cast<std::uint64_t>(t.type));
      for (const auto d : t.shape) add(d);
    }
    for (const auto& s : p.segments) {
      for (auto v : {std::uint64_t{s.tensor}, s.offset, s.bytes, s.shard_offset}) add(v);
    }
    for (const auto& c : p.chunks) {
      for (auto v : {std::uint64_t{c.shard}, c.shard_offset, c.bytes}) add(v);
    }
  });
}

std::uint64_t plan_digest(const plan& p) {
  return digest_of([&](auto add) {
    for (auto v : {p.layout, std::uint64_t{p.epoch}, p.chunk_bytes, std::uint64_t{p.depth},
                   std::uint64_t{p.shared_host_copies}, static_cast<std::uint64_t>(p.p2p)}) {
      add(v);
    }
    auto add_place = [&](const device_place& place) {
      add(place.host);
      add(place.rdma);
      add(place.gpu);
      add(place.reads.size());
      for (const auto& gpu : place.reads) add(gpu);
    };
    for (const auto& place : p.shard_places) add_place(place);
    auto add_address = [&](const address& a) {
      add(a.node);
      add(a.actor);
    };
    for (const auto& s : p.shards) add_address(s);
    for (const auto& inst : p.instances) {
      add(inst.id);
      for (const auto& w : inst.workers) add_address(w);
      for (const auto l : inst.leaders) add(l);
      for (const auto& place : inst.places) add_place(place);
    }
    for (const auto& who : p.audiences) {
      add(who.size());
      for (const auto& w : who) add_address(w);
    }
    for (const auto& s : p.segments) add(s.audience);
    for (const auto& c : p.chunks) add(c.audience);
  });
}

}  // namespace ferry
