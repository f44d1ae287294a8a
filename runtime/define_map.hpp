#pragma once
/// FERRY_DEFINE_MAP(fields...): a struct's msgpack form is a map of its field names to their
/// values. The wire format and the rules are MSGPACK_DEFINE_MAP's: every key must be a string,
/// unknown keys are ignored, a missing field keeps its value, a repeated key counts once (its
/// first). The code is ours, for speed: msgpack-c's decoder builds a std::map of every key as a
/// std::string for each struct decoded (a tenth of a simulated update), its encoder looks for
/// the end of each name; here names are compared in place, and decoding may skip msgpack-c's
/// object tree altogether (`wire_reader`).
#include <cstdint>
#include <msgpack.hpp>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include "runtime/wire_reader.hpp"

namespace ferry::detail {

/// A struct's fields with their names: `name, field, name, field, ...` as references.
template <class... Pairs>
class named_fields {
 public:
  static constexpr std::size_t count = sizeof...(Pairs) / 2;
  static_assert(sizeof...(Pairs) % 2 == 0 && count <= 64, "FERRY_DEFINE_MAP takes up to 64 fields");

  explicit named_fields(Pairs&... pairs) : pairs_(pairs...) {}

  template <class Packer>
  void pack(Packer& packer) const {
    packer.pack_map(count);
    each([&](std::string_view key, const auto& field) {
      packer.pack_str(static_cast<std::uint32_t>(key.size()));
      packer.pack_str_body(key.data(), static_cast<std::uint32_t>(key.size()));
      packer.pack(field);
    });
  }

  /// From a msgpack-c object (a map), as msgpack-c's own conversion would.
  void convert(const msgpack::object& o) {
    if (o.type != msgpack::type::MAP) throw msgpack::type_error();
    const std::span<const msgpack::object_kv> entries(o.via.map.ptr, o.via.map.size);
    for (const auto& kv : entries)
      if (kv.key.type != msgpack::type::STR) throw msgpack::type_error();
    each([&](std::string_view key, auto& field) {
      for (const auto& kv : entries)
        if (std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key) {
          kv.val.convert(field);
          return;
        }
    });
  }

  /// Straight from the bytes: each entry's key finds its field, a field's first entry counts.
  void read(wire_reader& in) {
    std::uint64_t seen = 0;
    for (auto n = in.enter_map(); n > 0; --n) {
      const auto key = in.key();
      if (!read_field(in, key, seen, std::make_index_sequence<count>())) in.skip();
    }
    in.leave();
  }

 private:
  template <std::size_t N>
  static constexpr std::string_view name(const char (&literal)[N]) {
    return {literal, N - 1};
  }

  /// `f(name, field)` for each field, in order; the fields are the struct's, const or not.
  template <class F>
  void each(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(name(std::get<2 * I>(pairs_)), std::get<2 * I + 1>(pairs_)), ...);
    }
    (std::make_index_sequence<count>());
  }

  /// Reads the value into the field named `key`, unless it was read before; false when no field
  /// has that name or it was.
  template <std::size_t... I>
  bool read_field(wire_reader& in, std::string_view key, std::uint64_t& seen,
                  std::index_sequence<I...>) {
    return ([&] {
      if (key != name(std::get<2 * I>(pairs_)) || (seen >> I & 1)) return false;
      seen |= std::uint64_t{1} << I;
      in.read(std::get<2 * I + 1>(pairs_));
      return true;
    }() || ...);
  }

  std::tuple<Pairs&...> pairs_;
};

template <class... Pairs>
named_fields<Pairs...> name_fields(Pairs&... pairs) {
  return named_fields<Pairs...>(pairs...);
}

}  // namespace ferry::detail

/// `ferry_fields()` lists the fields with their names, for the codec's reader; msgpack-c's
/// packer and converter reach them through msgpack_pack and msgpack_unpack.
#define FERRY_DEFINE_MAP(...)                                                      \
  auto ferry_fields() {                                                            \
    return ::ferry::detail::name_fields MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__);      \
  }                                                                                \
  auto ferry_fields() const {                                                      \
    return ::ferry::detail::name_fields MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__);      \
  }                                                                                \
  template <typename Packer>                                                       \
  void msgpack_pack(Packer& msgpack_pk) const {                                    \
    ferry_fields().pack(msgpack_pk);                                               \
  }                                                                                \
  void msgpack_unpack(const msgpack::object& msgpack_o) {                          \
    ferry_fields().convert(msgpack_o);                                             \
  }                                                                                \
  template <typename MSGPACK_OBJECT>                                               \
  void msgpack_object(MSGPACK_OBJECT* msgpack_o, msgpack::zone& msgpack_z) const { \
    msgpack::type::make_define_map MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__)            \
        .msgpack_object(msgpack_o, msgpack_z);                                     \
  }

/// FERRY_DEFINE_ARRAY(fields...): MSGPACK_DEFINE_ARRAY, the compact form for structs sent by the
/// hundred thousand (a tensor, a piece of a chunk), with `ferry_array()` for the codec's reader to
/// read them straight from the bytes. A Kimi-K2 registration of 140k tensors went through
/// msgpack-c's object tree: a fifth of a 384-GPU simulation's wall time.
#define FERRY_DEFINE_ARRAY(...)   \
  auto ferry_array() {            \
    return std::tie(__VA_ARGS__); \
  }                               \
  MSGPACK_DEFINE_ARRAY(__VA_ARGS__)
