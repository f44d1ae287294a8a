#pragma once
/// How the workers of a rollout instance split the published tensor table between them, as
/// expert- or tensor-parallel inference engines do (`--shard-rollout`).
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "actors/tensor.hpp"

namespace ferry {

enum class rollout_sharding : std::uint8_t {
  none,  ///< every worker holds the whole table
  ep,    ///< experts split over the ranks, everything else on every rank
  tp,    ///< every tensor's rows (its first dimension) split over the ranks
};

result<rollout_sharding> parse_rollout_sharding(std::string_view name);  ///< "none", "ep" or "tp"
std::string_view rollout_sharding_name(rollout_sharding s);

/// What worker `rank` of an instance of `size` holds of `table` under `sharding`: specs (the
/// published ones) with the part each covers, and no memory yet (`data` null).
/// - tp: rows [rows * rank / size, rows * (rank + 1) / size) of each tensor; a rank that gets no
///   row of a tensor does not hold it; a 0-dimensional tensor is on every rank.
/// - ep: a tensor of routed expert e ("...experts.<e>.") whole on rank e % size; a dense layer's
///   MLP projections ("model.layers.<l>.mlp.gate_proj." ...) count as expert l. The rest
///   (attention, norms, embeddings, routers, shared experts) is on every rank.
std::vector<tensor_ref> rollout_share(std::span<const tensor_spec> table, rollout_sharding sharding, std::uint32_t rank,
                                      std::uint32_t size);

}  // namespace ferry
