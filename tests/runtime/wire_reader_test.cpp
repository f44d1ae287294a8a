#include "runtime/wire_reader.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/define_map.hpp"
#include "runtime/message.hpp"

namespace ferry::wire_test {
enum class shade : std::uint8_t { dark, light, clear };
}
MSGPACK_ADD_ENUM(ferry::wire_test::shade);

namespace ferry {
namespace {

using wire_test::shade;

/// The compact form: an array whose entries are the fields in order.
struct spot {
  std::string label;
  shade tone = shade::dark;
  std::vector<std::int64_t> dims;
  std::uint64_t size = 0;
  friend bool operator==(const spot&, const spot&) = default;
  FERRY_DEFINE_ARRAY(label, tone, dims, size)
};

struct leaf {
  std::uint8_t small = 0;
  std::int16_t signed_value = 0;
  double real = 0;
  bool flag = false;
  std::string text;
  FERRY_DEFINE_MAP(small, signed_value, real, flag, text)
};

/// Every kind of field: read directly, or (a map) through msgpack-c.
struct tree {
  std::uint64_t id = 0;
  std::vector<leaf> leaves;
  std::vector<std::uint32_t> numbers;
  std::map<std::string, std::int32_t> extra;
  address where;
  float ratio = 0;
  std::vector<std::vector<std::int64_t>> grid;
  std::vector<spot> spots;
  FERRY_DEFINE_MAP(id, leaves, numbers, extra, where, ratio, grid, spots)
};

std::vector<std::byte> packed(const auto& value) {
  msgpack::sbuffer b;
  msgpack::pack(b, value);
  const auto* p = reinterpret_cast<const std::byte*>(b.data());
  return {p, p + b.size()};
}

bool same(const leaf& a, const leaf& b);
bool same(const tree& a, const tree& b);

/// Equal values; NaNs count as equal. (Packing them again to compare bytes is no way: msgpack-c
/// packs a float of 2^64 as an integer, with undefined behaviour.)
template <class T>
bool same(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a == b || (a != a && b != b);
  } else if constexpr (requires {
                         a.begin();
                         a.size();
                       } &&
                       !std::is_same_v<T, std::string>) {
    if (a.size() != b.size()) return false;
    auto i = b.begin();
    for (const auto& x : a)
      if (!same(x, *i++)) return false;
    return true;
  } else {
    return a == b;
  }
}

bool same(const leaf& a, const leaf& b) {
  return a.small == b.small && a.signed_value == b.signed_value && same(a.real, b.real) &&
         a.flag == b.flag && a.text == b.text;
}

bool same(const tree& a, const tree& b) {
  return a.id == b.id && same(a.leaves, b.leaves) && a.numbers == b.numbers && a.extra == b.extra &&
         a.where == b.where && same(a.ratio, b.ratio) && a.grid == b.grid && a.spots == b.spots;
}

/// What came of reading `bytes` as a T: the value and whether bytes were left over, or nothing
/// when it failed.
template <class T>
struct outcome {
  std::optional<T> value;
  bool trailing = false;
  friend bool operator==(const outcome& a, const outcome& b) {
    return a.trailing == b.trailing && a.value.has_value() == b.value.has_value() &&
           (!a.value || same(*a.value, *b.value));
  }
};

template <class T>
outcome<T> through_msgpack_c(const std::vector<std::byte>& bytes,
                             const msgpack::unpack_limit& caps) {
  try {
    msgpack::zone zone;
    std::size_t offset = 0;
    const auto o = msgpack::unpack(zone, reinterpret_cast<const char*>(bytes.data()), bytes.size(),
                                   offset, nullptr, nullptr, caps);
    T value;
    o.convert(value);
    return {std::move(value), offset != bytes.size()};
  } catch (const std::exception&) {
    return {};
  }
}

template <class T>
outcome<T> through_wire_reader(const std::vector<std::byte>& bytes,
                               const msgpack::unpack_limit& caps) {
  try {
    msgpack::zone zone;
    detail::wire_reader in(bytes, zone, caps);
    T value;
    in.read(value);
    return {std::move(value), !in.at_end()};
  } catch (const std::exception&) {
    return {};
  }
}

const msgpack::unpack_limit roomy(1024, 1024, 1024, 1024, 1024, 16);

tree sample_tree() {
  return {
      .id = (1ull << 40) + 3,
      .leaves = {{.small = 200, .signed_value = -300, .real = 2.5, .flag = true, .text = "alpha"},
                 {.small = 1, .signed_value = 7, .real = -1e300, .text = std::string(40, 'x')}},
      .numbers = {0, 127, 128, 65536, std::numeric_limits<std::uint32_t>::max()},
      .extra = {{"k", -5}, {"z", 1 << 20}},
      .where = {.node = 9, .actor = 4},
      .ratio = 0.75f,
      .grid = {{-1, 1}, {}, {std::numeric_limits<std::int64_t>::min()}},
      .spots = {{.label = "w", .tone = shade::clear, .dims = {7168, 2048}, .size = 1u << 24}, {}}};
}

TEST(wire_reader, reads_a_value_as_msgpack_c_converts_it) {
  const auto bytes = packed(sample_tree());
  const auto ours = through_wire_reader<tree>(bytes, roomy);
  ASSERT_TRUE(ours.value.has_value());
  EXPECT_FALSE(ours.trailing);
  EXPECT_TRUE(ours == through_msgpack_c<tree>(bytes, roomy));
  EXPECT_EQ(packed(*ours.value), bytes);
}

/// Each scalar, in every encoding msgpack has for it, read as each field type.
TEST(wire_reader, converts_scalars_by_msgpack_c_rules) {
  std::vector<std::vector<std::byte>> values;
  for (const std::uint64_t u : std::initializer_list<std::uint64_t>{
           0, 127, 128, 255, 256, 65535, 65536, 0xffff'ffff, 0x1'0000'0000, 1ull << 63, ~0ull})
    values.push_back(packed(u));
  for (const std::int64_t i : std::initializer_list<std::int64_t>{
           -1, -32, -33, -128, -129, -32768, -32769, std::numeric_limits<std::int64_t>::min()})
    values.push_back(packed(i));
  // Signed encodings of values >= 0, which msgpack's packer never makes but a peer may.
  for (const auto& raw : {std::vector<std::uint8_t>{0xd0, 0x05},
                          {0xd1, 0x00, 0x80},
                          {0xd3, 0, 0, 0, 0, 0, 0, 0, 1}}) {
    values.emplace_back();
    for (auto b : raw) values.back().push_back(std::byte{b});
  }
  values.push_back(packed(1.5f));
  values.push_back(packed(-2.25));
  values.push_back(packed(true));
  values.push_back(packed(std::string("s")));
  values.push_back(packed(std::vector<char>{'b', 'i', 'n'}));
  values.push_back(packed(msgpack::type::nil_t()));

  auto same_as_msgpack_c = [&]<class T>(T) {
    for (std::size_t v = 0; v < values.size(); ++v)
      EXPECT_TRUE(through_wire_reader<T>(values[v], roomy) ==
                  through_msgpack_c<T>(values[v], roomy))
          << "value " << v << " as " << typeid(T).name();
  };
  same_as_msgpack_c(std::uint8_t{});
  same_as_msgpack_c(std::int8_t{});
  same_as_msgpack_c(std::uint16_t{});
  same_as_msgpack_c(std::int16_t{});
  same_as_msgpack_c(std::uint32_t{});
  same_as_msgpack_c(std::int32_t{});
  same_as_msgpack_c(std::uint64_t{});
  same_as_msgpack_c(std::int64_t{});
  same_as_msgpack_c(float{});
  same_as_msgpack_c(double{});
  same_as_msgpack_c(bool{});
  same_as_msgpack_c(std::string{});
  same_as_msgpack_c(shade{});
}

/// An array-shaped struct takes as many fields as the array has entries, in order, and passes over
/// the entries past its last field.
TEST(wire_reader, reads_short_and_long_arrays_into_a_struct_as_msgpack_c_does) {
  const std::map<std::string, int> more{{"m", 1}};
  const std::vector<std::vector<std::byte>> arrays{
      packed(std::vector<int>{}),
      packed(std::make_tuple(std::string("only"))),
      packed(std::make_tuple(std::string("two"), 1)),
      packed(std::make_tuple(std::string("all"), 2, std::vector<int>{3, 4}, 5)),
      packed(std::make_tuple(std::string("more"), 0, std::vector<int>{}, 6, more, 7.5)),
      packed(std::make_tuple(std::string("wrong"), 300)),  // no shade is 300
      packed(std::make_tuple(std::string("wrong"), std::string("x"))),
      packed(std::make_tuple(1, 2))};
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    const auto theirs = through_msgpack_c<spot>(arrays[a], roomy);
    EXPECT_TRUE(through_wire_reader<spot>(arrays[a], roomy) == theirs) << "array " << a;
    EXPECT_EQ(theirs.value.has_value(), a < 5) << "array " << a;
  }
}

/// Seeded damage to a value: each damaged copy is read, or refused, as msgpack-c reads or refuses
/// it, under roomy caps and under caps the value exceeds.
TEST(wire_reader, accepts_and_refuses_what_msgpack_c_does) {
  const auto good = packed(sample_tree());
  const msgpack::unpack_limit tight(4, 6, 8, 8, 8, 2);
  // Bytes that start each kind of value, so that damage often makes another well-formed value.
  const std::uint8_t starts[] = {0x00, 0x7f, 0x80, 0x81, 0x8f, 0x90, 0x93, 0xa0, 0xa3, 0xbf, 0xc0,
                                 0xc1, 0xc2, 0xc3, 0xc4, 0xc7, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf,
                                 0xd0, 0xd3, 0xd4, 0xd8, 0xd9, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};
  const unsigned seed = 20261127;
  std::mt19937 rng(seed);
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    auto bytes = good;
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0 && !bytes.empty(); --edits) {
      const auto at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = std::byte(starts[rng() % std::size(starts)]);
          break;
        case 1:
          bytes[at] = std::byte(rng() & 0xff);
          break;
        case 2:
          bytes.resize(at);
          break;
        default:
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                       std::byte(starts[rng() % std::size(starts)]));
      }
    }
    for (const auto* caps : {&roomy, &tight}) {
      const auto theirs = through_msgpack_c<tree>(bytes, *caps);
      ASSERT_TRUE(through_wire_reader<tree>(bytes, *caps) == theirs)
          << "seed " << seed << ", round " << round << (caps == &tight ? ", tight caps" : "");
      accepted += theirs.value.has_value();
    }
  }
  EXPECT_GT(accepted, 100);  // the damage must not only make garbage
}

}  // namespace
}  // namespace ferry
