#include "actors/rollout_sharding.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace ferry {
namespace {

std::vector<std::string> names(const std::vector<tensor_ref>& share) {
  std::vector<std::string> out;
  for (const auto& t : share) out.push_back(t.spec.name);
  return out;
}

/// Two MoE layers of four routed experts each, a dense first layer, and what every rank keeps.
std::vector<tensor_spec> moe_table() {
  std::vector<tensor_spec> table{
      make_tensor_spec("model.embed_tokens.weight", dtype::bf16, {8, 4}),
      make_tensor_spec("model.layers.0.mlp.gate_proj.weight", dtype::bf16, {8, 4}),
      make_tensor_spec("model.layers.0.input_layernorm.weight", dtype::bf16, {4})};
  for (const int layer : {1, 2}) {
    table.push_back(make_tensor_spec(
        "model.layers." + std::to_string(layer) + ".self_attn.q_proj.weight", dtype::bf16, {6, 4}));
    table.push_back(make_tensor_spec(
        "model.layers." + std::to_string(layer) + ".mlp.shared_experts.up_proj.weight", dtype::bf16,
        {4, 4}));
    for (int e = 0; e < 4; ++e)
      table.push_back(make_tensor_spec("model.layers." + std::to_string(layer) + ".mlp.experts." +
                                           std::to_string(e) + ".down_proj.weight",
                                       dtype::bf16, {4, 2}));
  }
  table.push_back(make_tensor_spec("lm_head.weight", dtype::bf16, {8, 4}));
  return table;
}

TEST(rollout_sharding, ep_puts_each_expert_on_one_rank_and_the_rest_on_all) {
  const auto table = moe_table();
  const auto share = names(rollout_share(table, rollout_sharding::ep, 1, 2));
  const std::vector<std::string> rank1{"model.embed_tokens.weight",
                                       "model.layers.0.input_layernorm.weight",
                                       "model.layers.1.self_attn.q_proj.weight",
                                       "model.layers.1.mlp.shared_experts.up_proj.weight",
                                       "model.layers.1.mlp.experts.1.down_proj.weight",
                                       "model.layers.1.mlp.experts.3.down_proj.weight",
                                       "model.layers.2.self_attn.q_proj.weight",
                                       "model.layers.2.mlp.shared_experts.up_proj.weight",
                                       "model.layers.2.mlp.experts.1.down_proj.weight",
                                       "model.layers.2.mlp.experts.3.down_proj.weight",
                                       "lm_head.weight"};
  EXPECT_EQ(share, rank1);  // the dense layer 0's projection counts as expert 0: rank 0's
}

TEST(rollout_sharding, ep_tp_splits_experts_by_rank_and_every_other_matrix_by_rows) {
  const auto table = moe_table();
  std::map<std::string, byte_range> held;
  for (const auto& t : rollout_share(table, rollout_sharding::ep_tp, 1, 2))
    held[t.spec.name] = t.held();
  const auto rows = [](std::uint64_t first, std::uint64_t count, std::uint64_t row_bytes) {
    return byte_range{first * row_bytes, count * row_bytes};
  };
  const std::map<std::string, byte_range> rank1{
      {"model.embed_tokens.weight", rows(4, 4, 8)},
      {"model.layers.0.mlp.gate_proj.weight", rows(4, 4, 8)},    // a dense MLP: tensor-parallel
      {"model.layers.0.input_layernorm.weight", rows(0, 4, 2)},  // a norm: whole
      {"model.layers.1.self_attn.q_proj.weight", rows(3, 3, 8)},
      {"model.layers.1.mlp.shared_experts.up_proj.weight", rows(2, 2, 8)},
      {"model.layers.1.mlp.experts.1.down_proj.weight", rows(0, 4, 4)},
      {"model.layers.1.mlp.experts.3.down_proj.weight", rows(0, 4, 4)},
      {"model.layers.2.self_attn.q_proj.weight", rows(3, 3, 8)},
      {"model.layers.2.mlp.shared_experts.up_proj.weight", rows(2, 2, 8)},
      {"model.layers.2.mlp.experts.1.down_proj.weight", rows(0, 4, 4)},
      {"model.layers.2.mlp.experts.3.down_proj.weight", rows(0, 4, 4)},
      {"lm_head.weight", rows(4, 4, 8)}};
  EXPECT_EQ(held, rank1);
}

TEST(rollout_sharding, every_ranks_share_at_once_is_each_ranks_share) {
  const auto table = moe_table();
  for (const auto sharding : {rollout_sharding::none, rollout_sharding::ep, rollout_sharding::tp,
                              rollout_sharding::pp_tp, rollout_sharding::ep_tp}) {
    for (const std::uint32_t size : {1u, 2u, 3u, 4u}) {
      const auto all = rollout_shares(table, sharding, size);
      ASSERT_EQ(all.size(), size);
      for (std::uint32_t rank = 0; rank < size; ++rank) {
        const auto one = rollout_share(table, sharding, rank, size);
        ASSERT_EQ(all[rank].size(), one.size())
            << rollout_sharding_name(sharding) << " rank " << rank << " of " << size;
        for (std::size_t i = 0; i < one.size(); ++i) {
          EXPECT_EQ(all[rank][i].spec, one[i].spec);
          EXPECT_EQ(all[rank][i].held(), one[i].held());
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry
