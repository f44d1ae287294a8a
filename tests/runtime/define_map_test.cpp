#include "runtime/define_map.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace ferry {
namespace {

struct inner {
  std::uint32_t a = 0;
  std::string b;
  FERRY_DEFINE_MAP(a, b)
};

struct outer {
  std::uint64_t version = 7;
  inner nested;
  std::vector<inner> list;
  FERRY_DEFINE_MAP(version, nested, list)
};

/// The same fields through msgpack-c's own macro: the wire format must not differ.
struct inner_msgpack {
  std::uint32_t a = 0;
  std::string b;
  MSGPACK_DEFINE_MAP(a, b)
};
struct outer_msgpack {
  std::uint64_t version = 7;
  inner_msgpack nested;
  std::vector<inner_msgpack> list;
  MSGPACK_DEFINE_MAP(version, nested, list)
};

template <class T>
std::string packed(const T& value) {
  msgpack::sbuffer b;
  msgpack::pack(b, value);
  return {b.data(), b.size()};
}

template <class T>
T unpacked(const std::string& bytes) {
  return msgpack::unpack(bytes.data(), bytes.size()).get().as<T>();
}

TEST(define_map, packs_the_bytes_msgpack_c_packs_and_reads_them_back) {
  const outer ours{
      .version = 1ull << 40, .nested = {.a = 3, .b = "x"}, .list = {{.a = 4, .b = "yy"}, {.a = 5}}};
  const outer_msgpack theirs{
      .version = 1ull << 40, .nested = {.a = 3, .b = "x"}, .list = {{.a = 4, .b = "yy"}, {.a = 5}}};
  ASSERT_EQ(packed(ours), packed(theirs));
  const auto back = unpacked<outer>(packed(theirs));
  EXPECT_EQ(back.version, 1ull << 40);
  EXPECT_EQ(back.nested.a, 3u);
  EXPECT_EQ(back.nested.b, "x");
  ASSERT_EQ(back.list.size(), 2u);
  EXPECT_EQ(back.list[0].b, "yy");
  EXPECT_EQ(back.list[1].a, 5u);
}

TEST(define_map, follows_msgpack_c_on_unknown_missing_and_repeated_keys) {
  // Keys in another order, one unknown, `b` twice (the first counts), `a` missing from the second.
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_map(4);
  p.pack(std::string("b"));
  p.pack(std::string("first"));
  p.pack(std::string("extra"));
  p.pack(42);
  p.pack(std::string("a"));
  p.pack(9);
  p.pack(std::string("b"));
  p.pack(std::string("second"));
  const std::string bytes(b.data(), b.size());
  const auto ours = unpacked<inner>(bytes);
  const auto theirs = unpacked<inner_msgpack>(bytes);
  EXPECT_EQ(ours.a, 9u);
  EXPECT_EQ(ours.b, "first");
  EXPECT_EQ(ours.b, theirs.b);

  const auto partial = unpacked<outer>(packed(std::map<std::string, std::uint32_t>{{"other", 1}}));
  EXPECT_EQ(partial.version, 7u);  // missing: keeps its value
  EXPECT_TRUE(partial.list.empty());
}

TEST(define_map, rejects_what_msgpack_c_rejects) {
  const auto non_string_key = packed(std::map<std::uint32_t, std::uint32_t>{{1, 2}});
  EXPECT_THROW(unpacked<inner>(non_string_key), msgpack::type_error);
  EXPECT_THROW(unpacked<inner_msgpack>(non_string_key), msgpack::type_error);
  const auto not_a_map = packed(std::vector<std::uint32_t>{1, 2});
  EXPECT_THROW(unpacked<inner>(not_a_map), msgpack::type_error);
  EXPECT_THROW(unpacked<inner_msgpack>(not_a_map), msgpack::type_error);
  const auto wrong_type = packed(std::map<std::string, std::string>{{"a", "not a number"}});
  EXPECT_THROW(unpacked<inner>(wrong_type), msgpack::type_error);
  EXPECT_THROW(unpacked<inner_msgpack>(wrong_type), msgpack::type_error);
}

}  // namespace
}  // namespace ferry
