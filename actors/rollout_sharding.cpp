#include "actors/rollout_sharding.hpp"

#include <algorithm>
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
  for (const std::string_view projection :
       {".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj."}) {
    if (name.find(projection) != std::string_view::npos) return number_after(name, "layers.");
  }
  return std::nullopt;
}

/// Rows [rows * rank / size, rows * (rank + 1) / size) of `t`, or nothing when that is empty.
std::optional<tensor_ref> rows_of(const tensor_spec& t, std::uint32_t rank, std::uint32_t size) {
  const auto rows = static_cast<std::uint64_t>(t.shape[0]);
  const std::uint64_t row_bytes = rows == 0 ? 0 : t.nbytes / rows;
  const std::uint64_t first = rows * rank / size, last = rows * (rank + 1) / size;
  if (first == last) return std::nullopt;
  return tensor_ref{.spec = t, .part = byte_range{first * row_bytes, (last - first) * row_bytes}};
}

/// pp-tp: the stage each tensor belongs to, of `stages`.
std::uint32_t stage_of(std::string_view name, std::uint64_t layers, std::uint32_t stages) {
  if (const auto l = number_after(name, "layers."))
    return static_cast<std::uint32_t>(*l * stages / layers);
  return name.find("embed") != std::string_view::npos ? 0 : stages - 1;
}

}  // namespace

result<rollout_sharding> parse_rollout_sharding(std::string_view name) {
  if (name == "none") return rollout_sharding::none;
  if (name == "ep") return rollout_sharding::ep;
  if (name == "tp") return rollout_sharding::tp;
  if (name == "pp-tp") return rollout_sharding::pp_tp;
  if (name == "ep-tp") return rollout_sharding::ep_tp;
  return fail(errc::invalid_argument);
}

std::string_view rollout_sharding_name(rollout_sharding s) {
  switch (s) {
    case rollout_sharding::ep:
      return "ep";
    case rollout_sharding::tp:
      return "tp";
    case rollout_sharding::pp_tp:
      return "pp-tp";
    case rollout_sharding::ep_tp:
      return "ep-tp";
    default:
      return "none";
  }
}

std::vector<tensor_ref> rollout_share(std::span<const tensor_spec> table, rollout_sharding sharding,
                                      std::uint32_t rank, std::uint32_t size) {
  std::uint64_t layers = 1;  // pp-tp only: a pass over the table's names (140k for Kimi-K2)
  for (const auto& t :
       sharding == rollout_sharding::pp_tp ? table : std::span<const tensor_spec>{}) {
    if (const auto l = number_after(t.name, "layers.")) layers = std::max(layers, *l + 1);
  }
  const std::uint32_t stages = std::min(size, 2u);
  const std::uint32_t stage =
      rank * stages / size;  // the stage of `rank`: the inverse of `first_rank`
  const auto first_rank = [&](std::uint32_t s) { return (size * s + stages - 1) / stages; };
  std::vector<tensor_ref> out;
  for (const auto& t : table) {
    if (sharding == rollout_sharding::ep) {
      if (const auto e = expert_of(t.name); e && *e % size != rank) continue;
      out.push_back({.spec = t});
    } else if (sharding == rollout_sharding::ep_tp) {
      if (const auto e = number_after(t.name, ".experts.")) {
        if (*e % size == rank) out.push_back({.spec = t});
      } else if (t.shape.size() <= 1) {
        out.push_back({.spec = t});
      } else if (auto mine = rows_of(t, rank, size)) {
        out.push_back(std::move(*mine));
      }
    } else if (sharding == rollout_sharding::tp && !t.shape.empty()) {
      if (auto mine = rows_of(t, rank, size)) out.push_back(std::move(*mine));
    } else if (sharding == rollout_sharding::pp_tp) {
      if (stage_of(t.name, layers, stages) != stage) continue;
      const std::uint32_t tp_rank = rank - first_rank(stage),
                          tp = first_rank(stage + 1) - first_rank(stage);
      if (t.shape.size() <= 1) {
        out.push_back({.spec = t});
      } else if (auto mine = rows_of(t, tp_rank, tp)) {
        out.push_back(std::move(*mine));
      }
    } else {
      out.push_back({.spec = t});
    }
  }
  return out;
}

std::vector<std::vector<tensor_ref>> rollout_shares(std::span<const tensor_spec> table,
                                                    rollout_sharding sharding, std::uint32_t size) {
  std::vector<std::vector<tensor_ref>> shares;
  if (sharding != rollout_sharding::ep && sharding != rollout_sharding::ep_tp) {
    for (std::uint32_t rank = 0; rank < size; ++rank)
      shares.push_back(rollout_share(table, sharding, rank, size));
    return shares;
  }
  shares.resize(size);
  for (const auto& t : table) {
    const auto e =
        sharding == rollout_sharding::ep ? expert_of(t.name) : number_after(t.name, ".experts.");
    if (e) {
      shares[*e % size].push_back({.spec = t});
    } else if (sharding == rollout_sharding::ep || t.shape.size() <= 1) {
      for (auto& share : shares) share.push_back({.spec = t});
    } else {
      for (std::uint32_t rank = 0; rank < size; ++rank)
        if (auto mine = rows_of(t, rank, size)) shares[rank].push_back(std::move(*mine));
    }
  }
  return shares;
}

}  // namespace ferry
