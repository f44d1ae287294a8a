#include "runtime/wire_reader.hpp"

#include <array>
#include <bit>
#include <boost/container/small_vector.hpp>
#include <iterator>

namespace ferry::detail {
namespace {

/// What a msgpack type byte starts, laid out as msgpack-c's parser reads it.
struct shape {
  enum kind_t : std::uint8_t { scalar, str, bin, ext, array, map, invalid } kind = invalid;
  std::uint8_t size_bytes = 0;  ///< big-endian length or count after the type byte
  std::uint8_t fixed = 0;       ///< scalar: payload bytes; fix types: the length or count itself
};

/// 0xc4-0xdf, in order, as msgpack-c's parser lays them out (its table of trail bytes).
// clang-format off
constexpr shape typed[] = {
    {shape::bin, 1, 0},    {shape::bin, 2, 0},    {shape::bin, 4, 0},     // bin 8/16/32
    {shape::ext, 1, 0},    {shape::ext, 2, 0},    {shape::ext, 4, 0},     // ext 8/16/32
    {shape::scalar, 0, 4}, {shape::scalar, 0, 8},                         // float 32/64
    {shape::scalar, 0, 1}, {shape::scalar, 0, 2}, {shape::scalar, 0, 4},  // uint 8/16/32
    {shape::scalar, 0, 8},                                                // uint 64
    {shape::scalar, 0, 1}, {shape::scalar, 0, 2}, {shape::scalar, 0, 4},  // int 8/16/32
    {shape::scalar, 0, 8},                                                // int 64
    // fixext 1/2/4/8/16: `fixed` is the data with its type byte, the size msgpack-c checks
    {shape::ext, 0, 2},    {shape::ext, 0, 3},    {shape::ext, 0, 5},    {shape::ext, 0, 9},
    {shape::ext, 0, 17},
    {shape::str, 1, 0},    {shape::str, 2, 0},    {shape::str, 4, 0},     // str 8/16/32
    {shape::array, 2, 0},  {shape::array, 4, 0},                          // array 16/32
    {shape::map, 2, 0},    {shape::map, 4, 0},                            // map 16/32
};
// clang-format on
static_assert(std::size(typed) == 0xdf - 0xc4 + 1);

constexpr shape shape_of(std::uint8_t b) {
  if (b <= 0x7f || b >= 0xe0) return {shape::scalar, 0, 0};
  if (b <= 0x8f) return {shape::map, 0, static_cast<std::uint8_t>(b & 0x0f)};
  if (b <= 0x9f) return {shape::array, 0, static_cast<std::uint8_t>(b & 0x0f)};
  if (b <= 0xbf) return {shape::str, 0, static_cast<std::uint8_t>(b & 0x1f)};
  if (b == 0xc1) return {};                     // no type has it
  if (b <= 0xc3) return {shape::scalar, 0, 0};  // nil, false, true
  return typed[b - 0xc4];
}

constexpr auto shapes = [] {
  std::array<shape, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = shape_of(static_cast<std::uint8_t>(b));
  return t;
}();

std::uint64_t big_endian(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

/// The length or count of the value whose type byte is at `p`, which the shape's size bytes follow.
std::uint64_t size_of(const shape& s, const std::uint8_t* p) {
  return s.size_bytes ? big_endian(p + 1, s.size_bytes) : s.fixed;
}

/// Where the value at `at`, inside `outside` open containers, ends; 0 where msgpack-c's parser
/// would fail on it.
std::size_t scan(const std::uint8_t* data, std::size_t size, std::size_t at,
                 const msgpack::unpack_limit& caps, std::size_t outside) {
  // Values still to come in each open container (a map's entries count twice).
  boost::container::small_vector<std::uint64_t, 16> open;
  for (;;) {
    if (at >= size) return 0;
    const auto b = data[at];
    if (b <= 0x7f || b >= 0xe0) {
      ++at;  // a fixint, the commonest value
    } else {
      const auto s = shapes[b];
      std::size_t left = size - at - 1;
      if (s.kind == shape::invalid) return 0;
      if (left < s.size_bytes) return 0;
      const std::uint64_t n = size_of(s, data + at);
      at += 1 + s.size_bytes;
      left -= s.size_bytes;
      if (s.kind == shape::scalar) {
        if (left < s.fixed) return 0;
        at += s.fixed;
      } else if (s.kind == shape::array || s.kind == shape::map) {
        if (n > (s.kind == shape::array ? caps.array() : caps.map())) return 0;
        if (outside + open.size() + 1 > caps.depth()) return 0;
        if (n > 0) {
          open.push_back(s.kind == shape::map ? 2 * n : n);
          continue;
        }
      } else {
        // An ext's data is its type byte and its length's bytes; the fixext sizes count both.
        const std::uint64_t data_bytes = s.kind == shape::ext && s.size_bytes ? n + 1 : n;
        if (left < data_bytes) return 0;
        const std::size_t cap = s.kind == shape::str   ? caps.str()
                                : s.kind == shape::bin ? caps.bin()
                                                       : caps.ext();
        if (data_bytes > cap) return 0;
        at += data_bytes;
      }
    }
    // A value ended: it completes the containers whose last value it was.
    while (!open.empty() && --open.back() == 0) open.pop_back();
    if (open.empty()) return at;
  }
}

}  // namespace

msgpack::unpack_limit wire_reader::caps_within() const {
  const auto depth = caps_.depth() > depth_ ? caps_.depth() - depth_ : 0;
  return {caps_.array(), caps_.map(), caps_.str(), caps_.bin(), caps_.ext(), depth};
}

std::uint32_t wire_reader::enter(bool map) {
  if (at_ >= size_) throw wire_error();
  const auto b = data_[at_];
  if (map ? !is_map(b) : !is_array(b)) throw msgpack::type_error();
  const auto s = shapes[b];
  const auto n = size_of(s, take(1 + s.size_bytes));
  if (n > (map ? caps_.map() : caps_.array()) || depth_ + 1 > caps_.depth()) throw wire_error();
  ++depth_;
  return static_cast<std::uint32_t>(n);
}

std::string_view wire_reader::key() {
  if (at_ < size_ && (data_[at_] & 0xe0) == 0xa0) {  // a fixstr, as every key of ours is
    const std::size_t n = data_[at_] & 0x1f;
    const auto* p = take(1 + n);
    if (n > caps_.str()) throw wire_error();
    return {reinterpret_cast<const char*>(p + 1), n};
  }
  if (at_ < size_ && shapes[data_[at_]].kind != shape::str) throw msgpack::type_error();
  return read_str_or_bin();
}

std::string_view wire_reader::read_str_or_bin() {
  if (at_ >= size_) throw wire_error();
  const auto s = shapes[data_[at_]];
  if (s.kind != shape::str && s.kind != shape::bin) throw msgpack::type_error();
  const auto n = size_of(s, take(1 + s.size_bytes));
  if (n > (s.kind == shape::str ? caps_.str() : caps_.bin())) throw wire_error();
  return {reinterpret_cast<const char*>(take(n)), n};
}

void wire_reader::skip() {
  const auto end = scan(data_, size_, at_, caps_, depth_);
  if (end == 0) throw wire_error();
  at_ = end;
}

bool wire_reader::try_integer(integer& out) {
  if (at_ >= size_) throw wire_error();
  const auto b = data_[at_];
  if (b <= 0x7f) {
    out = {.u = b};
    at_ += 1;
    return true;
  }
  if (b >= 0xe0) {
    out = {.negative = true, .i = static_cast<std::int8_t>(b)};
    at_ += 1;
    return true;
  }
  if (b >= 0xcc && b <= 0xcf) {
    const std::size_t n = std::size_t{1} << (b - 0xcc);
    out = {.u = big_endian(take(1 + n) + 1, n)};
    return true;
  }
  if (b >= 0xd0 && b <= 0xd3) {
    const std::size_t n = std::size_t{1} << (b - 0xd0);
    const auto raw = big_endian(take(1 + n) + 1, n);
    // Sign-extend from n bytes; msgpack-c keeps a signed encoding of a value >= 0 as positive.
    const auto shift = 64 - 8 * n;
    const auto v = static_cast<std::int64_t>(raw << shift) >> shift;
    out = v < 0 ? integer{.negative = true, .i = v} : integer{.u = static_cast<std::uint64_t>(v)};
    return true;
  }
  return false;
}

bool wire_reader::read_bool() {
  if (at_ >= size_) throw wire_error();
  const auto b = data_[at_];
  if (b != 0xc2 && b != 0xc3) throw msgpack::type_error();
  at_ += 1;
  return b == 0xc3;
}

double wire_reader::read_float() {
  if (at_ >= size_) throw wire_error();
  const auto b = data_[at_];
  if (b == 0xca)
    return std::bit_cast<float>(static_cast<std::uint32_t>(big_endian(take(5) + 1, 4)));
  if (b == 0xcb) return std::bit_cast<double>(big_endian(take(9) + 1, 8));
  throw msgpack::type_error();
}

}  // namespace ferry::detail
