#include "actors/messages.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <variant>

#include "protocol/protocol.hpp"
#include "runtime/codec.hpp"
#include "tests/fuzz/sample_messages.hpp"

namespace ferry {
namespace {

/// A version_complete whose `busy.apply` is `apply`, packed by hand so any msgpack value fits.
template <class T>
frame version_complete_with_apply(T apply) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_array(6);
  p.pack(protocol_version);
  p.pack(version_complete::kind);
  p.pack(address{1, 1});
  p.pack(address{0, 1});
  p.pack(std::uint32_t{0});
  p.pack_map(5);
  p.pack("instance"), p.pack(0u);
  p.pack("rank"), p.pack(0u);
  p.pack("version"), p.pack(1u);
  p.pack("busy"), p.pack_map(5);
  for (const char* stage : {"offload", "send", "upload", "broadcast"}) p.pack(stage), p.pack(0.5);
  p.pack("apply"), p.pack(apply);
  p.pack("digests"), p.pack_array(0);
  frame f(frame_prefix_bytes + b.size());
  std::memcpy(f.data() + frame_prefix_bytes, b.data(), b.size());
  detail::finish_prefix(f);
  return f;
}

message_registry registry() {
  message_registry r;
  register_runtime_messages(r);
  register_actor_messages(r);
  return r;
}

/// The frame fuzzer's find: an unsigned 2^64-1 where a duration goes decoded to the double 2^64,
/// which msgpack-c's pack_double converts to uint64_t with undefined behaviour when the message
/// is packed again. Such durations (and NaN, infinities, negatives) are malformed bodies now.
TEST(protocol_messages, durations_out_of_range_are_malformed_bodies) {
  const auto r = registry();
  EXPECT_TRUE(decode_frame(version_complete_with_apply(0.25), r, {}).has_value());
  EXPECT_EQ(
      decode_frame(version_complete_with_apply(std::numeric_limits<std::uint64_t>::max()), r, {})
          .error(),
      errc::malformed_body);
  EXPECT_EQ(decode_frame(version_complete_with_apply(std::nan("")), r, {}).error(),
            errc::malformed_body);
  EXPECT_EQ(decode_frame(version_complete_with_apply(-1.0), r, {}).error(), errc::malformed_body);
  EXPECT_EQ(
      decode_frame(version_complete_with_apply(std::numeric_limits<double>::infinity()), r, {})
          .error(),
      errc::malformed_body);
}

/// What decoding `payload` came to: the error, or the frame of what it decoded, encoded again.
using outcome = std::variant<std::error_code, frame>;

/// decode_payload reads a frame in one pass and leaves any other to msgpack-c's decoder: over every
/// message of the protocol and seeded damage to each, the two must come to the same outcome.
TEST(protocol_messages, one_pass_decoding_agrees_with_msgpack_c_on_every_message_and_its_damage) {
  const auto& registry = protocol();
  std::map<msg_kind, std::function<frame(const decoded_message&)>> encode_again;
  std::vector<frame> frames;
  fuzz::for_each_message([&]<class M>(const M& m) {
    encode_again[M::kind] = [](const decoded_message& d) { return encode(d.head, d.as<M>()); };
    frames.push_back(encode(fuzz::sample_header(), m));
  });
  auto outcome_of = [&](const result<decoded_message>& r) -> outcome {
    if (!r) return r.error();
    return encode_again.at(r->head.kind)(*r);
  };
  const unsigned seed = 1127;
  std::mt19937 rng(seed);
  const codec_limits limits{};
  const codec_limits tight{
      .max_depth = 3, .max_array = 8, .max_map = 8, .max_str = 16, .max_bin = 16};
  int decoded = 0;
  for (const auto& f : frames) {
    const std::vector<std::byte> good(f.begin() + frame_prefix_bytes, f.end());
    for (int round = 0; round < 400; ++round) {
      auto payload = good;
      if (round > 0) {
        for (int edits = 1 + static_cast<int>(rng() % 2); edits > 0 && !payload.empty(); --edits) {
          const auto at = rng() % payload.size();
          if (rng() % 5 == 0) {
            payload.resize(at);
          } else {
            payload[at] = std::byte(rng() & 0xff);
          }
        }
      }
      for (const auto* caps : {&limits, &tight}) {
        const auto theirs = outcome_of(detail::decode_through_msgpack_c(payload, registry, *caps));
        ASSERT_EQ(outcome_of(decode_payload(payload, registry, *caps)), theirs)
            << "seed " << seed << ", frame of kind " << std::to_integer<int>(good[2]) << ", round "
            << round << (caps == &tight ? ", tight caps" : "");
        decoded += std::holds_alternative<frame>(theirs);
      }
    }
  }
  EXPECT_GT(decoded,
            static_cast<int>(frames.size()));  // undamaged frames and some damaged ones decode
}

}  // namespace
}  // namespace ferry
