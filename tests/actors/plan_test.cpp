#include "actors/plan.hpp"

#include <gtest/gtest.h>

#include <map>

#include "actors/synthetic_model.hpp"

namespace ferry {
namespace {

plan_inputs inputs(std::vector<std::vector<tensor_spec>> shards, std::uint64_t chunk) {
  plan_inputs in;
  in.chunk_bytes = chunk;
  for (std::uint32_t s = 0; s < shards.size(); ++s) in.shards.push_back({s + 1, 1});
  in.shard_tensors = std::move(shards);
  in.instances = {{.id = 0, .workers = {{10, 1}, {11, 1}}}};
  return in;
}

TEST(plan, packs_aligns_splits_and_covers_every_byte_once) {
  const std::vector<tensor_spec> a{make_tensor_spec("small1", dtype::f32, {3}),     // 12 bytes
                                   make_tensor_spec("big", dtype::bf16, {1000, 3}),  // 6000 bytes
                                   make_tensor_spec("small2", dtype::u8, {5})};
  std::string why;
  auto p = make_plan(inputs({a}, 1024), why);
  ASSERT_TRUE(p) << why;
  std::map<std::uint32_t, std::uint64_t> covered;
  std::map<std::uint32_t, std::uint64_t> start;  // tensor -> stream offset
  for (const auto& c : p->chunks) {
    EXPECT_LE(c.bytes, 1024u);
    for (const auto& piece : c.pieces) {
      covered[piece.tensor] += piece.bytes;
      EXPECT_LE(piece.chunk_offset + piece.bytes, c.bytes);
      if (piece.tensor_offset == 0) start[piece.tensor] = c.shard_offset + piece.chunk_offset;
    }
  }
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(covered[i], p->tensors[i].nbytes) << p->tensors[i].name;
    EXPECT_EQ(start[i] % tensor_alignment, 0u) << p->tensors[i].name;
  }
  // Small tensors share a chunk with the head of the big one; the big one spans several chunks.
  EXPECT_EQ(p->chunks[0].pieces.size(), 2u);
  EXPECT_EQ(start[1], 256u);
  EXPECT_EQ(p->chunks.size(), (256 + 6000 + 256 - 1) / 1024 + 1);
  EXPECT_EQ(p->instances[0].leaders, std::vector<std::uint32_t>{0});
}

TEST(plan, interleaves_shards_so_all_senders_start_at_once) {
  const auto model = synthetic_transformer(8 << 20);
  std::string why;
  auto p = make_plan(inputs(split_over_shards(model, 2), 256 << 10), why);
  ASSERT_TRUE(p) << why;
  ASSERT_GE(p->chunks.size(), 4u);
  EXPECT_EQ(p->chunks[0].shard, 0u);
  EXPECT_EQ(p->chunks[1].shard, 1u);
  EXPECT_EQ(p->chunks[2].shard, 0u);
  for (std::uint32_t i = 0; i < p->chunks.size(); ++i) EXPECT_EQ(p->chunks[i].id, i);
  EXPECT_EQ(p->chunks_of(0).size() + p->chunks_of(1).size(), p->chunks.size());
}

TEST(plan, refuses_bad_tables_with_the_tensor_named) {
  std::string why;
  EXPECT_FALSE(make_plan(inputs({{make_tensor_spec("w", dtype::f32, {4})}}, 100), why));
  EXPECT_NE(why.find("alignment"), std::string::npos);

  EXPECT_FALSE(make_plan(inputs({{make_tensor_spec("w", dtype::f32, {0})}}, 1024), why));
  EXPECT_NE(why.find("'w' has zero bytes"), std::string::npos) << why;

  EXPECT_FALSE(make_plan(inputs({{make_tensor_spec("w", dtype::f32, {4}), make_tensor_spec("w", dtype::f32, {4})}}, 1024), why));
  EXPECT_NE(why.find("'w' is registered twice"), std::string::npos) << why;

  EXPECT_FALSE(make_plan(inputs({{make_tensor_spec("w", dtype::f32, {4})}, {make_tensor_spec("w", dtype::f32, {4})}}, 1024), why));
  EXPECT_NE(why.find("owned by shards 0 and 1"), std::string::npos) << why;

  auto lying = make_tensor_spec("w", dtype::f32, {4});
  lying.nbytes = 15;
  EXPECT_FALSE(make_plan(inputs({{lying}}, 1024), why));
  EXPECT_NE(why.find("contradict"), std::string::npos) << why;
}

TEST(plan, leaders_must_be_distinct_ranks_of_the_instance) {
  std::string why;
  auto in = inputs({{make_tensor_spec("w", dtype::f32, {4})}}, 1024);
  in.instances[0].leaders = {0, 1};
  EXPECT_TRUE(make_plan(in, why)) << why;
  in.instances[0].leaders = {1, 1};
  EXPECT_FALSE(make_plan(in, why));
  EXPECT_NE(why.find("names a leader twice"), std::string::npos) << why;
  in.instances[0].leaders = {0, 2};
  EXPECT_FALSE(make_plan(in, why));
  EXPECT_NE(why.find("past its size"), std::string::npos) << why;
}

TEST(plan, worker_registration_must_match_the_trainers) {
  std::string why;
  auto p = make_plan(inputs({{make_tensor_spec("w", dtype::bf16, {4, 4}), make_tensor_spec("b", dtype::f32, {4})}}, 1024), why);
  ASSERT_TRUE(p);
  EXPECT_TRUE(check_worker_tensors(*p, std::vector{make_tensor_spec("b", dtype::f32, {4}), make_tensor_spec("w", dtype::bf16, {4, 4})}, why));
  EXPECT_FALSE(check_worker_tensors(*p, std::vector{make_tensor_spec("w", dtype::f32, {4, 2}), make_tensor_spec("b", dtype::f32, {4})}, why));
  EXPECT_NE(why.find("'w' differs"), std::string::npos) << why;
  EXPECT_FALSE(check_worker_tensors(*p, std::vector{make_tensor_spec("w", dtype::bf16, {4, 4})}, why));
  EXPECT_NE(why.find("did not register it"), std::string::npos) << why;
  EXPECT_FALSE(check_worker_tensors(*p, std::vector{make_tensor_spec("w", dtype::bf16, {4, 4}), make_tensor_spec("b", dtype::f32, {4}),
                                                    make_tensor_spec("extra", dtype::u8, {1})}, why));
  EXPECT_NE(why.find("'extra', which no trainer publishes"), std::string::npos) << why;
}

TEST(choose_leaders, stripes_devices_and_the_first_leader_keeping_its_role) {
  const std::vector<address> four{{10, 1}, {11, 1}, {12, 1}, {13, 1}};
  using leaders = std::vector<std::uint32_t>;
  EXPECT_EQ(choose_leaders(four, 0, false, std::nullopt), leaders{0});            // hosts: one leader
  EXPECT_EQ(choose_leaders(four, 0, true, std::nullopt), (leaders{0, 1, 2, 3}));  // devices: every member
  EXPECT_EQ(choose_leaders(four, 2, true, std::nullopt), (leaders{0, 1}));
  EXPECT_EQ(choose_leaders(four, 9, false, std::nullopt), (leaders{0, 1, 2, 3}));  // at most the instance
  // The previous first leader (node 12) lives: it stays first, the lowest other ranks follow.
  EXPECT_EQ(choose_leaders(four, 3, false, address{12, 1}), (leaders{2, 0, 1}));
  // It died: the lowest live rank takes over.
  EXPECT_EQ(choose_leaders(four, 1, false, address{99, 1}), leaders{0});
}

}  // namespace
}  // namespace ferry
