#include "actors/rollout_sharding.hpp"

#include <charconv>
#include <optional>

namespace ferry {
namespace {

/// The number right after `marker` in `name`, if there is one.
std::optional<std::uint64_t> number_after(std::string_view name, std::string_view marker) {
  const auto at = name.find(marker);
  if (at == std::string_view::npos) return std::nullopt;
  const auto digits = name.substr(at + marker.size());
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end == digits.data()) return std::nullopt;
  return n;
}

/// The expert a tensor belongs to under `ep`, if any: a routed expert's number, or a dense layer's
/// MLP projection's layer. Shared experts and routers are on every rank.
std::optional<std::uint64_t> expert_of(std::string_view name) {
  if (auto e = number_after(name, ".experts.")) return e;
  for (const std::string_view projection : {".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj."}) {
    if (name.find(projection) != std::string_view::npos) return number_after(name, "layers.");
  }
  return std::nullopt;
}

}  // namespace

result<rollout_sharding> parse_rollout_sharding(std::string_view name) {
  if (name == "none") return rollout_sharding::none;
  if (name == "ep") return rollout_sharding::ep;
  if (name == "tp") return rollout_sharding::tp;
  return fail(errc::invalid_argument);
}

std::string_view rollout_sharding_name(rollout_sharding s) {
  switch (s) {
    case rollout_sharding::ep: return "ep";
    case rollout_sharding::tp: return "tp";
    default: return "none";
  }
}

std::vector<tensor_ref> rollout_share(std::span<const tensor_spec> table, rollout_sharding sharding, std::uint32_t rank,
                                      std::uint32_t size) {
  std::vector<tensor_ref> out;
  for (const auto& t : table) {
    if (sharding == rollout_sharding::ep) {
      if (const auto e = expert_of(t.name); e && *e % size != rank) continue;
      out.push_back({.spec = t});
    } else if (sharding == rollout_sharding::tp && !t.shape.empty()) {
      const auto rows = static_cast<std::uint64_t>(t.shape[0]);
      const std::uint64_t row_bytes = rows == 0 ? 0 : t.nbytes / rows;
      const std::uint64_t first = rows * rank / size, last = rows * (rank + 1) / size;
      if (first == last) continue;
      out.push_back({.spec = t, .part = byte_range{first * row_bytes, (last - first) * row_bytes}});
    } else {
      out.push_back({.spec = t});
    }
  }
  return out;
}

}  // namespace ferry
