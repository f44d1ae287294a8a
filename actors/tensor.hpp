#pragma once
/// Tensors as ferry sees them: a name, a dtype, a shape and the bytes they span.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errc.hpp"
#include "runtime/message.hpp"

namespace ferry {

enum class dtype : std::uint8_t { u8, i8, i16, i32, i64, f16, bf16, f32, f64, fp8_e4m3, fp8_e5m2 };

std::size_t dtype_bytes(dtype t);
std::string_view dtype_name(dtype t);
result<dtype> parse_dtype(std::string_view name);

/// What a tensor is, without where it lives.
struct tensor_spec {
  std::string name;
  dtype type = dtype::u8;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;
  friend bool operator==(const tensor_spec&, const tensor_spec&) = default;
  FERRY_DEFINE_ARRAY(name, type, shape, nbytes)  // one per tensor, 140k in Kimi-K2: compact
};

/// `spec` for `name` with `shape`, its size computed from dtype and shape.
tensor_spec make_tensor_spec(std::string name, dtype type, std::vector<std::int64_t> shape);

/// Bytes [offset, offset + bytes) of a tensor.
struct byte_range {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t end() const { return offset + bytes; }
  friend auto operator<=>(const byte_range&, const byte_range&) = default;
  FERRY_DEFINE_ARRAY(offset, bytes)  // one per registered tensor: compact
};

/// A tensor registered by a trainer or a worker: its spec and its bytes (host memory, or a
/// device pointer when `device >= 0`).
struct tensor_ref {
  tensor_spec spec;
  std::byte* data = nullptr;
  int device = -1;
  /// A worker's share of the published tensor (row-parallel sharding): `data` holds only these
  /// bytes. None: all of it.
  std::optional<byte_range> part;
  byte_range held() const { return part ? *part : byte_range{0, spec.nbytes}; }
};

/// The bytes `tensors` hold: their `held()` ranges, summed.
std::uint64_t held_bytes(std::span<const tensor_ref> tensors);

/// Checks one process's table: names non-empty and unique, no zero-byte tensor, nbytes equal to
/// dtype size times shape. The error message names the tensor.
result<void> validate_tensor_table(std::span<const tensor_spec> table, std::string& why);

}  // namespace ferry

MSGPACK_ADD_ENUM(ferry::dtype);
