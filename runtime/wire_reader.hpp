#pragma once
/// Reading msgpack straight into structs. msgpack-c first builds a tree of objects in a zone and
/// then converts it: for the small control messages a simulation sends by the hundred thousand
/// that was most of decoding. `wire_reader` reads a frame in one pass, field by field, checking
/// as it goes everything msgpack-c's parser checks (the bytes are there, no byte that no type
/// has, sizes and depth within the codec's caps) and converting by msgpack-c's rules. Whatever
/// it cannot read throws, and the codec hands that frame to msgpack-c, which says what is wrong
/// with it. So a frame read here is one msgpack-c accepts, with the same values: the frame
/// fuzzer and `wire_reader_test` compare the two.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <msgpack.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/shared_vector.hpp"

namespace ferry::detail {

/// Bytes that msgpack-c's parser would not accept (where a type does not match, the reader throws
/// `msgpack::type_error`, as msgpack-c's conversion does).
struct wire_error : std::runtime_error {
  wire_error() : std::runtime_error("msgpack: bytes outside the format or the caps") {}
};

class wire_reader;

template <class T>
concept named_fields_struct = requires(T& t, wire_reader& r) {
  t.ferry_fields().read(r);
};

/// A struct whose msgpack form is an array of its fields (FERRY_DEFINE_ARRAY).
template <class T>
concept array_fields_struct = requires(T& t) {
  t.ferry_array();
};

template <class T>
struct read_directly
    : std::bool_constant<named_fields_struct<T> || array_fields_struct<T> || std::is_enum_v<T> ||
                         std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                         std::is_floating_point_v<T> ||
                         (std::is_integral_v<T> && !std::is_same_v<T, char>)> {};
// Vectors of bytes and of bools have msgpack-c rules of their own; those go through it.
template <class T, class A>
struct read_directly<std::vector<T, A>>
    : std::bool_constant<read_directly<T>::value && !std::is_same_v<T, bool> &&
                         !std::is_same_v<T, unsigned char> && !std::is_same_v<T, signed char>> {};

template <class T>
struct read_directly<shared_vector<T>> : read_directly<std::vector<T>> {};

/// A cursor over one msgpack value, read in place. Throws `wire_error` or `msgpack::type_error`
/// (above); types it has no direct read for are parsed by msgpack-c into `zone` and converted
/// there, strings left in the bytes.
class wire_reader {
 public:
  wire_reader(std::span<const std::byte> bytes, msgpack::zone& zone,
              const msgpack::unpack_limit& caps)
      : data_(reinterpret_cast<const std::uint8_t*>(bytes.data())),
        size_(bytes.size()),
        zone_(zone),
        caps_(caps) {}

  bool at_end() const { return at_ == size_; }
  bool at_map() const { return at_ < size_ && is_map(data_[at_]); }
  bool at_array() const { return at_ < size_ && is_array(data_[at_]); }

  /// Opens the map or array here and returns its entries; throws unless it is one. `leave()`
  /// closes it once its entries are read.
  std::uint32_t enter_map() { return enter(true); }
  std::uint32_t enter_array() { return enter(false); }
  void leave() { --depth_; }
  /// A map key: a string, read in place.
  std::string_view key();
  /// Passes over one whole value.
  void skip();

  /// A non-negative integer that fits `T` (the envelope's fields); false for anything else,
  /// after which the reader is of no further use.
  template <class T>
  bool read_unsigned(T& out) {
    integer v;
    if (!try_integer(v) || v.negative || v.u > std::numeric_limits<T>::max()) return false;
    out = static_cast<T>(v.u);
    return true;
  }

  /// msgpack-c's rules: integers must fit, floats take integers, strings take bins.
  template <class T>
  void read(T& out) {
    if constexpr (!read_directly<T>::value) {
      read_through_msgpack_c(out);
    } else if constexpr (std::is_same_v<T, bool>) {
      out = read_bool();
    } else if constexpr (std::is_integral_v<T>) {
      out = read_integer<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      out = read_floating<T>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      const auto s = read_str_or_bin();
      out.assign(s.data(), s.size());
    } else if constexpr (std::is_enum_v<T>) {
      out = static_cast<T>(read_integer<std::underlying_type_t<T>>());  // MSGPACK_ADD_ENUM's rule
    } else if constexpr (named_fields_struct<T>) {
      out.ferry_fields().read(*this);
    } else if constexpr (array_fields_struct<T>) {
      read_fields(out.ferry_array());
    } else if constexpr (is_shared_vector<T>) {
      std::vector<typename T::value_type> items;
      read(items);
      out = T(std::move(items));
    } else {
      out.resize(enter_array());
      for (auto& item : out) read(item);
      leave();
    }
  }

 private:
  static bool is_map(std::uint8_t b) { return (b & 0xf0) == 0x80 || b == 0xde || b == 0xdf; }
  static bool is_array(std::uint8_t b) { return (b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd; }

  /// An integer here: its value as msgpack-c keeps it (`negative` only below zero).
  struct integer {
    bool negative = false;
    std::uint64_t u = 0;
    std::int64_t i = 0;
  };
  /// Reads an integer if one is here; anything else stays unread.
  bool try_integer(integer& out);
  bool read_bool();
  std::string_view read_str_or_bin();
  double read_float();
  std::uint32_t enter(bool map);
  /// The next `n` bytes, which must be there.
  const std::uint8_t* take(std::size_t n) {
    if (size_ - at_ < n) throw wire_error();
    const auto* p = data_ + at_;
    at_ += n;
    return p;
  }

  /// MSGPACK_DEFINE_ARRAY's rule: the fields in order, as many as the array has; entries past
  /// the last field are passed over.
  template <class... F>
  void read_fields(std::tuple<F&...> fields) {
    const std::size_t n = enter_array();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I < n ? read(std::get<I>(fields)) : void()), ...);
    }
    (std::index_sequence_for<F...>());
    for (auto i = sizeof...(F); i < n; ++i) skip();
    leave();
  }

  template <class T>
  T read_integer() {
    integer v;
    if (!try_integer(v)) throw msgpack::type_error();
    if (!v.negative) {
      if (v.u > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        throw msgpack::type_error();
      return static_cast<T>(v.u);
    }
    if constexpr (std::is_signed_v<T>) {
      if (v.i < static_cast<std::int64_t>(std::numeric_limits<T>::min()))
        throw msgpack::type_error();
      return static_cast<T>(v.i);
    } else {
      throw msgpack::type_error();
    }
  }

  template <class T>
  T read_floating() {
    integer v;
    if (try_integer(v)) return v.negative ? static_cast<T>(v.i) : static_cast<T>(v.u);
    return static_cast<T>(read_float());
  }

  template <class T>
  void read_through_msgpack_c(T& out) {
    // msgpack-c counts depth from this value; the containers open around it count too.
    const auto caps = caps_within();
    std::size_t offset = at_;
    const auto o = msgpack::unpack(zone_, reinterpret_cast<const char*>(data_), size_, offset,
                                   in_place, nullptr, caps);
    at_ = offset;
    o.convert(out);
  }
  msgpack::unpack_limit caps_within() const;
  /// Strings and binaries stay where they lie: the value is converted before the bytes go.
  static bool in_place(msgpack::type::object_type, std::size_t, void*) { return true; }

  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
  std::size_t depth_ = 0;  ///< containers open here
  msgpack::zone& zone_;
  msgpack::unpack_limit caps_;
};

}  // namespace ferry::detail
