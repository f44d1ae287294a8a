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
  none,   ///< every worker holds the whole table
  ep,     ///< experts split over the ranks, everything else on every rank
  tp,     ///< every tensor's rows (its first dimension) split over the ranks
  pp_tp,  ///< two pipeline stages, each tensor-parallel over half of the ranks
  ep_tp,  ///< routed experts split over the ranks, every other tensor's rows too (tensor-parallel
          ///< attention)
};

result<rollout_sharding> parse_rollout_sharding(
    std::string_view name);  ///< "none", "ep", "tp", "pp-tp" or "ep-tp"
std::string_view rollout_sharding_name(rollout_sharding s);

/// What worker `rank` of an instance of `size` holds of `table` under `sharding`: specs (the
/// published ones) with the part each covers, and no memory yet (`data` null).
/// - tp: rows [rows * rank / size, rows * (rank + 1) / size) of each tensor; a rank that gets no
///   row of a tensor does not hold it; a 0-dimensional tensor is on every rank.
/// - ep: a tensor of routed expert e ("...experts.<e>.") whole on rank e % size; a dense layer's
///   MLP projections ("model.layers.<l>.mlp.gate_proj." ...) count as expert l. The rest
///   (attention, norms, embeddings, routers, shared experts) is on every rank.
/// - pp-tp: rank r is in pipeline stage r * 2 / size (one stage when size is 1). Layer l
///   ("layers.<l>.") belongs to stage l * 2 / layers, the embeddings to the first, every other
///   tensor (final norm, LM head) to the last. Within its stage a tensor's rows are split as under
///   tp, except a 1-dimensional one (a norm, a bias), which is whole on each of the stage's ranks,
///   as tensor-parallel engines keep it: those are heard by some, not all, of an instance's
///   workers.
/// - ep-tp: a routed expert's tensor whole on rank e % size, as under ep; every other tensor's rows
///   split as under tp, except a 1-dimensional one, whole on every rank (engines that run attention
///   and dense layers tensor-parallel beside expert-parallel MoE layers).
std::vector<tensor_ref> rollout_share(std::span<const tensor_spec> table, rollout_sharding sharding,
                                      std::uint32_t rank, std::uint32_t size);
/// Every rank's share, `rollout_share` of each: under ep in one pass over the names, where a
/// simulation's instance of 16 parsed Kimi-K2's 140k names 16 times.
std::vector<std::vector<tensor_ref>> rollout_shares(std::span<const tensor_spec> table,
                                                    rollout_sharding sharding, std::uint32_t size);

}  // namespace ferry
