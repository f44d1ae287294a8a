#include "actors/messages.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/codec.hpp"

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
  EXPECT_EQ(decode_frame(version_complete_with_apply(std::numeric_limits<std::uint64_t>::max()), r, {}).error(),
            errc::malformed_body);
  EXPECT_EQ(decode_frame(version_complete_with_apply(std::nan("")), r, {}).error(), errc::malformed_body);
  EXPECT_EQ(decode_frame(version_complete_with_apply(-1.0), r, {}).error(), errc::malformed_body);
  EXPECT_EQ(decode_frame(version_complete_with_apply(std::numeric_limits<double>::infinity()), r, {}).error(),
            errc::malformed_body);
}

}  // namespace
}  // namespace ferry
