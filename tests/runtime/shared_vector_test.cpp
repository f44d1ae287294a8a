#include "runtime/shared_vector.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/codec.hpp"
#include "runtime/messages.hpp"

namespace ferry {
namespace {

/// The same fields, one as a plain vector and one shared: they must be one wire form.
struct plain_table {
  static constexpr msg_kind kind{901};
  std::uint32_t id = 0;
  std::vector<std::string> names;
  FERRY_DEFINE_MAP(id, names)
};
struct shared_table {
  static constexpr msg_kind kind{901};
  std::uint32_t id = 0;
  shared_vector<std::string> names;
  FERRY_DEFINE_MAP(id, names)
};

std::vector<std::string> names(std::size_t n) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back("layer." + std::to_string(i) + ".weight");
  return out;
}

TEST(shared_vector, copies_share_one_vector_and_compare_by_contents) {
  const shared_vector<std::string> a(names(3));
  const auto copy = a;
  const shared_vector<std::string> equal(names(3)), other(names(4));
  EXPECT_TRUE(copy.same_object(a));
  EXPECT_EQ(&copy.items(), &a.items());
  EXPECT_FALSE(equal.same_object(a));
  EXPECT_EQ(equal, a);
  EXPECT_NE(other, a);
  EXPECT_EQ(a[2], "layer.2.weight");
  EXPECT_EQ(shared_vector<std::string>{}, shared_vector<std::string>(std::vector<std::string>{}));
  EXPECT_TRUE(shared_vector<std::string>{}.empty());
}

TEST(shared_vector, packs_and_reads_as_the_vector_it_replaces) {
  const envelope_header head{.from = {1, 2}, .to = {3, 4}, .epoch = 5};
  for (const std::size_t n : {0, 1, 15, 16, 70000}) {
    const plain_table plain{.id = 7, .names = names(n)};
    const shared_table shared{.id = 7, .names = names(n)};
    const auto f = encode(head, shared);
    ASSERT_EQ(f, encode(head, plain)) << n;

    message_registry registry;
    registry.add<shared_table>("shared_table");
    const codec_limits limits{.max_array = 1u << 20};
    // The one-pass reader and msgpack-c's object tree read the same vector.
    auto read = decode_frame(f, registry, limits);
    ASSERT_TRUE(read) << read.error().message();
    auto through_msgpack_c = detail::decode_through_msgpack_c(
        std::span(f).subspan(frame_prefix_bytes), registry, limits);
    ASSERT_TRUE(through_msgpack_c) << through_msgpack_c.error().message();
    for (const auto* m : {&*read, &*through_msgpack_c}) {
      EXPECT_EQ(m->as<shared_table>().id, 7u);
      EXPECT_EQ(m->as<shared_table>().names.items(), plain.names) << n;
    }
  }
}

TEST(shared_vector, a_frames_size_counts_its_contents_as_shared) {
  const envelope_header head{.from = {1, 2}, .to = {3, 4}, .epoch = 5};
  const shared_table shared{.id = 7, .names = names(1000)};
  const plain_table plain{.id = 7, .names = names(1000)};
  const auto size = frame_size(head, shared);
  EXPECT_EQ(size.bytes, encode(head, shared).size());
  msgpack::sbuffer array;
  msgpack::pack(array, names(1000));
  EXPECT_EQ(size.shared_bytes, array.size());
  // Counted again from the cache, the same.
  EXPECT_EQ(frame_size(head, shared).bytes, size.bytes);
  EXPECT_EQ(frame_size(head, plain).bytes, size.bytes);
  EXPECT_EQ(frame_size(head, plain).shared_bytes, 0u);
}

}  // namespace
}  // namespace ferry
