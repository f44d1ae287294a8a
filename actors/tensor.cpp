#include "actors/tensor.hpp"

#include <array>
#include <span>
#include <unordered_set>

namespace ferry {
namespace {
struct dtype_info {
  dtype type;
  std::string_view name;
  std::size_t bytes;
};
constexpr std::array<dtype_info, 11> dtypes{{{dtype::u8, "u8", 1},
                                             {dtype::i8, "i8", 1},
                                             {dtype::i16, "i16", 2},
                                             {dtype::i32, "i32", 4},
                                             {dtype::i64, "i64", 8},
                                             {dtype::f16, "f16", 2},
                                             {dtype::bf16, "bf16", 2},
                                             {dtype::f32, "f32", 4},
                                             {dtype::f64, "f64", 8},
                                             {dtype::fp8_e4m3, "fp8_e4m3", 1},
                                             {dtype::fp8_e5m2, "fp8_e5m2", 1}}};
}  // namespace

std::size_t dtype_bytes(dtype t) {
  return dtypes.at(static_cast<std::size_t>(t)).bytes;
}
std::string_view dtype_name(dtype t) {
  return dtypes.at(static_cast<std::size_t>(t)).name;
}

result<dtype> parse_dtype(std::string_view name) {
  for (const auto& d : dtypes) {
    if (d.name == name) return d.type;
  }
  return fail(errc::invalid_argument);
}

namespace {
std::uint64_t bytes_of(dtype type, std::span<const std::int64_t> shape) {
  std::uint64_t n = dtype_bytes(type);
  for (auto d : shape) n *= static_cast<std::uint64_t>(d < 0 ? 0 : d);
  return n;
}
}  // namespace

std::uint64_t held_bytes(std::span<const tensor_ref> tensors) {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += t.held().bytes;
  return n;
}

tensor_spec make_tensor_spec(std::string name, dtype type, std::vector<std::int64_t> shape) {
  const auto n = bytes_of(type, shape);
  return tensor_spec{.name = std::move(name), .type = type, .shape = std::move(shape), .nbytes = n};
}

result<void> validate_tensor_table(std::span<const tensor_spec> table, std::string& why) {
  std::unordered_set<std::string_view> names;  // hashed: a coordinator checks Kimi-K2's 140k names
  names.reserve(table.size());
  for (const auto& t : table) {
    if (t.name.empty()) {
      why = "a tensor has an empty name";
      return fail(errc::invalid_argument);
    }
    if (!names.insert(t.name).second) {
      why = "tensor '" + t.name + "' is registered twice";
      return fail(errc::invalid_argument);
    }
    if (static_cast<std::size_t>(t.type) >= dtypes.size()) {
      why = "tensor '" + t.name + "' has an unknown dtype";
      return fail(errc::invalid_argument);
    }
    if (t.nbytes == 0) {
      why = "tensor '" + t.name + "' has zero bytes";
      return fail(errc::invalid_argument);
    }
    if (bytes_of(t.type, t.shape) != t.nbytes) {
      why = "tensor '" + t.name + "' has " + std::to_string(t.nbytes) +
            " bytes, which its dtype and shape contradict";
      return fail(errc::invalid_argument);
    }
  }
  return {};
}

}  // namespace ferry
