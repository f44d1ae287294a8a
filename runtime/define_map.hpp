#pragma once
/// FERRY_DEFINE_MAP(fields...): a struct's msgpack form is a map of its field names to their
/// values. The wire format and the rules are MSGPACK_DEFINE_MAP's: every key must be a string,
/// unknown keys are ignored, a missing field keeps its value, a repeated key counts once (its
/// first). The decoder differs: msgpack-c's builds a std::map of every key as a std::string for
/// each struct decoded, which was a tenth of a simulated update; this one compares keys in place.
#include <cstring>
#include <msgpack.hpp>
#include <span>
#include <string_view>

namespace ferry::detail {

/// Reads named fields out of a msgpack map, in place.
class map_reader {
 public:
  explicit map_reader(const msgpack::object& o) : o_(o) {
    if (o.type != msgpack::type::MAP) throw msgpack::type_error();
    for (const auto& kv : entries())
      if (kv.key.type != msgpack::type::STR) throw msgpack::type_error();
  }

  /// `name, field, name, field, ...`
  template <class... Pairs>
  void read(Pairs&&... pairs) {
    read_pairs(pairs...);
  }

 private:
  std::span<const msgpack::object_kv> entries() const { return {o_.via.map.ptr, o_.via.map.size}; }

  const msgpack::object* find(std::string_view name) const {
    for (const auto& kv : entries())
      if (kv.key.via.str.size == name.size() && std::memcmp(kv.key.via.str.ptr, name.data(), name.size()) == 0)
        return &kv.val;
    return nullptr;
  }

  void read_pairs() {}
  template <class T, class... Rest>
  void read_pairs(const char* name, T& field, Rest&... rest) {
    if (const auto* value = find(name)) value->convert(field);
    read_pairs(rest...);
  }

  const msgpack::object& o_;
};

}  // namespace ferry::detail

#define FERRY_DEFINE_MAP(...)                                                                        \
  template <typename Packer>                                                                          \
  void msgpack_pack(Packer& msgpack_pk) const {                                                       \
    msgpack::type::make_define_map MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__).msgpack_pack(msgpack_pk);     \
  }                                                                                                   \
  void msgpack_unpack(const msgpack::object& msgpack_o) {                                             \
    ::ferry::detail::map_reader(msgpack_o).read MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__);                 \
  }                                                                                                   \
  template <typename MSGPACK_OBJECT>                                                                  \
  void msgpack_object(MSGPACK_OBJECT* msgpack_o, msgpack::zone& msgpack_z) const {                    \
    msgpack::type::make_define_map MSGPACK_DEFINE_MAP_IMPL(__VA_ARGS__).msgpack_object(msgpack_o, msgpack_z); \
  }
