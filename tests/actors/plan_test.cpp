#include "actors/plan.hpp"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <numeric>

#include "actors/stages.hpp"
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
  const std::vector<tensor_spec> a{make_tensor_spec("small1", dtype::f32, {3}),      // 12 bytes
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

  EXPECT_FALSE(make_plan(
      inputs({{make_tensor_spec("w", dtype::f32, {4}), make_tensor_spec("w", dtype::f32, {4})}},
             1024),
      why));
  EXPECT_NE(why.find("'w' is registered twice"), std::string::npos) << why;

  EXPECT_FALSE(make_plan(
      inputs({{make_tensor_spec("w", dtype::f32, {4})}, {make_tensor_spec("w", dtype::f32, {4})}},
             1024),
      why));
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
  const std::vector published{make_tensor_spec("w", dtype::bf16, {4, 4}),
                              make_tensor_spec("b", dtype::f32, {4})};
  selection selected;
  auto check = [&](std::vector<tensor_spec> worker, std::vector<byte_range> parts = {}) {
    return static_cast<bool>(
        check_worker_tensors(published_tensors(published), worker, parts, selected, why));
  };
  EXPECT_TRUE(
      check({make_tensor_spec("b", dtype::f32, {4}), make_tensor_spec("w", dtype::bf16, {4, 4})}));
  EXPECT_TRUE(selected.empty());  // the whole table: no selection
  EXPECT_FALSE(
      check({make_tensor_spec("w", dtype::f32, {4, 2}), make_tensor_spec("b", dtype::f32, {4})}));
  EXPECT_NE(why.find("'w' differs"), std::string::npos) << why;
  EXPECT_FALSE(
      check({make_tensor_spec("w", dtype::bf16, {4, 4}), make_tensor_spec("b", dtype::f32, {4}),
             make_tensor_spec("extra", dtype::u8, {1})}));
  EXPECT_NE(why.find("'extra', which no trainer publishes"), std::string::npos) << why;

  // Part of the table: a subset of tensors, or a range of one.
  EXPECT_TRUE(check({make_tensor_spec("w", dtype::bf16, {4, 4})})) << why;
  ASSERT_EQ(selected.size(), 1u);
  EXPECT_EQ(selected[0].range, (byte_range{0, 32}));
  EXPECT_TRUE(
      check({make_tensor_spec("w", dtype::bf16, {4, 4}), make_tensor_spec("b", dtype::f32, {4})},
            {{8, 16}, {0, 16}}))
      << why;
  ASSERT_EQ(selected.size(), 2u);  // sorted by name: b, w
  EXPECT_EQ(selected[1].range, (byte_range{8, 16}));
  EXPECT_FALSE(check({make_tensor_spec("w", dtype::bf16, {4, 4})}, {{24, 16}}));
  EXPECT_NE(why.find("bytes [24, 40), which lie outside its 32 bytes"), std::string::npos) << why;
  EXPECT_FALSE(check({make_tensor_spec("w", dtype::bf16, {4, 4})}, {{8, 0}}));
  EXPECT_FALSE(check(
      {make_tensor_spec("w", dtype::bf16, {4, 4}), make_tensor_spec("w", dtype::bf16, {4, 4})},
      {{0, 8}, {4, 8}}));
  EXPECT_NE(why.find("'w' is registered twice"), std::string::npos) << why;
}

/// One shard publishing `w` (f32, 1000 rows of 4 bytes) and `b` (f32, 64), to one instance of
/// workers A = {10, 1} and B = {11, 1} with the given selections.
plan_inputs selective(std::map<address, selection> selected, std::uint64_t chunk = 1024) {
  auto in =
      inputs({{make_tensor_spec("w", dtype::f32, {1000}), make_tensor_spec("b", dtype::f32, {64})}},
             chunk);
  for (auto& [who, s] : selected) in.select(who, std::move(s));
  in.require_coverage = true;
  return in;
}

const address worker_a{10, 1}, worker_b{11, 1};

/// A holds rows [0, 500) of w, B rows [375, 1000) (they share [375, 500)); both hold b whole.
plan_inputs overlapping_rows() {
  return selective({{worker_a, {{"w", {0, 2000}}, {"b", {0, 256}}}},
                    {worker_b, {{"w", {1500, 2500}}, {"b", {0, 256}}}}});
}

TEST(plan, selective_segments_are_cut_at_ranges_and_packed_by_audience) {
  std::string why;
  auto p = make_plan(overlapping_rows(), why);
  ASSERT_TRUE(p) << why;
  ASSERT_EQ(p->segments.size(), 4u);   // w: A alone, both, B alone; b: both
  EXPECT_EQ(p->audiences.size(), 3u);  // everyone, {A}, {B}
  const auto& inst = p->instances[0];
  // Each worker's chunks carry exactly its registered bytes (padding aside), each byte once;
  // a chunk has one audience, and rows that straddle chunk boundaries split into pieces.
  for (const auto& [who, wanted] :
       std::map<address, std::uint64_t>{{worker_a, 2000 + 256}, {worker_b, 2500 + 256}}) {
    std::map<std::pair<std::uint32_t, std::uint64_t>, int> seen;  // (tensor, byte) -> times
    std::uint64_t got = 0;
    for (const auto& c : p->chunks) {
      if (!p->hears(c.audience, who)) continue;
      for (const auto& piece : c.pieces) {
        got += piece.bytes;
        for (std::uint64_t b = 0; b < piece.bytes; b += 4)
          ++seen[{piece.tensor, piece.tensor_offset + b}];
      }
    }
    EXPECT_EQ(got, wanted);
    for (const auto& [at, times] : seen) EXPECT_EQ(times, 1) << at.first << "@" << at.second;
    EXPECT_LE(p->bytes_for(who), wanted * 11 / 10 + 4 * 256);
  }
  std::uint32_t straddling = 0;
  for (const auto& c : p->chunks) {
    const auto hearers = p->hearers(inst, c.audience);
    EXPECT_EQ(p->whole_instance(inst, c.audience), hearers.size() == 2);
    for (const auto& piece : c.pieces) {
      bool found = false;
      for (const auto& s : p->segments) {
        found = found || (s.tensor == piece.tensor && s.audience == c.audience &&
                          s.offset <= piece.tensor_offset &&
                          piece.tensor_offset + piece.bytes <= s.offset + s.bytes);
      }
      EXPECT_TRUE(found) << "a piece outside its chunk's audience";
      straddling += piece.tensor_offset % 4 != 0 || piece.bytes % 4 != 0;
    }
  }
  EXPECT_EQ(straddling, 0u);  // row boundaries stay row boundaries (chunks are 256-aligned)
  EXPECT_GT(p->chunks.size(), 3u);
}

TEST(plan_index, finds_tensors_by_name_and_each_audiences_segments_and_places_a_members_table) {
  std::string why;
  auto made = make_plan(overlapping_rows(), why);
  ASSERT_TRUE(made) << why;
  const auto p = std::make_shared<const plan>(std::move(*made));
  const auto index = plan_index::of(p);
  EXPECT_EQ(plan_index::of(p), index);  // one per plan while it is kept
  EXPECT_EQ(index->tensor_named("w"), 0);
  EXPECT_EQ(index->tensor_named("b"), 1);
  EXPECT_EQ(index->tensor_named("x"), -1);
  // Every segment under its own audience, once, in plan order.
  std::vector<std::uint32_t> all;
  for (std::uint32_t a = 0; a < p->audiences.size(); ++a) {
    const auto of = index->segments_of(a);
    EXPECT_TRUE(std::ranges::is_sorted(of));
    for (const auto i : of) EXPECT_EQ(p->segments[i].audience, a) << "segment " << i;
    all.insert(all.end(), of.begin(), of.end());
  }
  std::ranges::sort(all);
  std::vector<std::uint32_t> every(p->segments.size());
  std::iota(every.begin(), every.end(), 0u);
  EXPECT_EQ(all, every);

  // A member holding b then w, and one (shard 0's trainer, or another) told whose tensors to place.
  std::array<std::byte, 8> b_bytes{}, w_bytes{};
  const std::vector<tensor_ref> local{
      {.spec = p->tensors[1], .data = b_bytes.data()},
      {.spec = p->tensors[0], .data = w_bytes.data(), .part = byte_range{1500, 8}}};
  const tensor_placement placed(*index, local);
  EXPECT_EQ(placed.local_index(0), 1);
  EXPECT_EQ(placed.local_index(1), 0);
  EXPECT_EQ(placed.at(0, 1504), w_bytes.data() + 4);  // its part starts at byte 1500
  EXPECT_EQ(tensor_placement(*index, local, 0).local_index(0), 1);
  EXPECT_EQ(tensor_placement(*index, local, 1).local_index(0), -1);  // shard 0 owns it
  const std::vector<tensor_ref> other{{.spec = make_tensor_spec("x", dtype::u8, {1})}};
  EXPECT_EQ(tensor_placement(*index, other).local_index(0), -1);
  EXPECT_EQ(index->flaw(), "");
}

TEST(plan_index, names_what_a_member_cannot_read_in_a_plan_from_the_wire) {
  std::string why;
  auto made = make_plan(selective({{worker_a, {{"w", {0, 2000}}, {"b", {0, 256}}}}}), why);
  ASSERT_TRUE(made) << why;
  const auto audiences = static_cast<std::uint32_t>(made->audiences.size());
  auto with = [&](auto&& spoil) {
    auto p = *made;
    spoil(p);
    return plan_index(std::make_shared<const plan>(std::move(p)));
  };
  const auto bad_segment = with([&](plan& p) { p.segments[1].audience = audiences; });
  EXPECT_EQ(bad_segment.flaw(), "has segment 1 in audience " + std::to_string(audiences) +
                                    ", past its " + std::to_string(audiences));
  std::size_t listed = 0;
  for (std::uint32_t a = 0; a < audiences; ++a) listed += bad_segment.segments_of(a).size();
  EXPECT_EQ(listed, made->segments.size() - 1);  // the others stay readable
  EXPECT_EQ(with([&](plan& p) { p.chunks[0].audience = audiences + 7; }).flaw(),
            "has chunk 0 in audience " + std::to_string(audiences + 7) + ", past its " +
                std::to_string(audiences));
  EXPECT_EQ(with([](plan& p) { p.chunks[1].id = 0; }).flaw(), "has chunk 0 in place 1");
}

TEST(plan, the_layout_outlives_the_workers_and_changes_only_with_a_new_part) {
  std::string why;
  const selection a{{"b", {0, 256}}, {"w", {0, 2000}}}, b{{"b", {0, 256}}, {"w", {2000, 2000}}};
  auto in = selective({{worker_a, a}, {worker_b, b}});
  auto both = make_plan(in, why);
  ASSERT_TRUE(both) << why;
  // A dies: its bytes stay in the layout (same chunk ids), but nobody hears them now.
  in.instances[0].workers = {worker_b};
  in.selected.erase(worker_a);
  in.require_coverage = false;
  auto alone = make_plan(in, why);
  ASSERT_TRUE(alone) << why;
  EXPECT_EQ(alone->layout, both->layout);
  ASSERT_EQ(alone->chunks.size(), both->chunks.size());
  for (std::size_t i = 0; i < both->chunks.size(); ++i) {
    EXPECT_EQ(alone->chunks[i].shard_offset, both->chunks[i].shard_offset);
    EXPECT_EQ(alone->hears(alone->chunks[i].audience, worker_b),
              both->hears(both->chunks[i].audience, worker_b));
  }
  EXPECT_EQ(alone->bytes_for(worker_b), both->bytes_for(worker_b));
  EXPECT_LT(alone->bytes_for(worker_b), alone->total_bytes());
  // A replacement with a part never seen before moves the cuts: another layout.
  in.instances[0].workers = {worker_a, worker_b};
  in.select(worker_a, {{"b", {0, 256}}, {"w", {0, 1000}}});
  auto moved = make_plan(in, why);
  ASSERT_TRUE(moved) << why;
  EXPECT_NE(moved->layout, both->layout);
}

TEST(plan, a_plan_without_selections_has_one_segment_per_tensor_for_everyone) {
  std::string why;
  auto p = make_plan(selective({}), why);
  ASSERT_TRUE(p) << why;
  ASSERT_EQ(p->segments.size(), 2u);
  EXPECT_EQ(p->audiences.size(), 1u);
  for (const auto& c : p->chunks) EXPECT_EQ(c.audience, 0u);
  EXPECT_EQ(p->bytes_for(worker_a), p->total_bytes());
}

TEST(plan, unclaimed_bytes_are_refused_before_any_byte_moves) {
  std::string why;
  // Rows [250, 500) of w belong to nobody.
  EXPECT_FALSE(make_plan(selective({{worker_a, {{"w", {0, 1000}}, {"b", {0, 256}}}},
                                    {worker_b, {{"w", {2000, 2000}}}}}),
                         why));
  EXPECT_NE(why.find("no worker registered bytes [1000, 2000) of tensor 'w'"), std::string::npos)
      << why;
  // A second instance whose one worker takes everything does not help the first.
  auto in = selective({{worker_a, {{"w", {0, 4000}}}}, {worker_b, {{"w", {0, 4000}}}}});
  in.instances.push_back({.id = 1, .workers = {{12, 1}}});
  EXPECT_FALSE(make_plan(in, why));
  EXPECT_NE(why.find("instance 0 leaves bytes [0, 256) of tensor 'b' unclaimed"), std::string::npos)
      << why;
  in.require_coverage = false;  // a regroup after a loss: what nobody holds is not sent
  auto p = make_plan(in, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->bytes_for(worker_a), 4000u);
  EXPECT_EQ(p->bytes_for({12, 1}), 4000u + 256u);
}

TEST(choose_leaders, stripes_devices_and_the_first_leader_keeping_its_role) {
  const std::vector<address> four{{10, 1}, {11, 1}, {12, 1}, {13, 1}};
  using leaders = std::vector<std::uint32_t>;
  EXPECT_EQ(choose_leaders(four, 0, false, std::nullopt), leaders{0});  // hosts: one leader
  EXPECT_EQ(choose_leaders(four, 0, true, std::nullopt),
            (leaders{0, 1, 2, 3}));  // devices: every member
  EXPECT_EQ(choose_leaders(four, 2, true, std::nullopt), (leaders{0, 1}));
  EXPECT_EQ(choose_leaders(four, 9, false, std::nullopt),
            (leaders{0, 1, 2, 3}));  // at most the instance
  // The previous first leader (node 12) lives: it stays first, the lowest other ranks follow.
  EXPECT_EQ(choose_leaders(four, 3, false, address{12, 1}), (leaders{2, 0, 1}));
  // It died: the lowest live rank takes over.
  EXPECT_EQ(choose_leaders(four, 1, false, address{99, 1}), leaders{0});
}

TEST(path_between, gpu_to_gpu_where_the_gpus_allow_and_the_mode_lets_it) {
  const device_place trainer{.host = 1, .gpu = "A", .reads = {"A"}, .rdma = true};
  const device_place reads_it{.host = 1, .gpu = "B", .reads = {"B", "A"}, .rdma = true};
  const device_place no_peer{.host = 1, .gpu = "C", .reads = {"C"}, .rdma = false};
  const device_place same_gpu{.host = 1, .gpu = "A", .reads = {"A"}};
  const device_place elsewhere{.host = 2, .gpu = "A", .reads = {"A"}, .rdma = true};
  const device_place on_host{.host = 1};
  using enum chunk_path;
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, reads_it), device_direct);
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, same_gpu), device_direct);
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, no_peer), host_copy);
  EXPECT_EQ(path_between(p2p_mode::device, trainer, no_peer),
            device_direct);  // forced: fails loudly if it cannot
  // Another host: a UUID alike says nothing there; GPUDirect where both transports reach their
  // GPUs.
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, elsewhere), gpudirect);
  EXPECT_EQ(path_between(p2p_mode::device, trainer, elsewhere), gpudirect);
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, {.host = 2, .gpu = "D", .reads = {"D"}}),
            host_copy);
  EXPECT_EQ(path_between(p2p_mode::automatic, trainer, on_host), host_copy);
  EXPECT_EQ(path_between(p2p_mode::automatic, on_host, reads_it), host_copy);
  EXPECT_EQ(path_between(p2p_mode::automatic, device_place{.gpu = "A"}, same_gpu),
            host_copy);  // no host known
  for (const auto& worker : {reads_it, same_gpu, elsewhere})
    EXPECT_EQ(path_between(p2p_mode::host, trainer, worker), host_copy);
}

TEST(plan, keeps_each_kind_of_copy_its_workers_need_and_counts_the_paths) {
  plan_inputs in = inputs(
      {{make_tensor_spec("a", dtype::u8, {4096})}, {make_tensor_spec("b", dtype::u8, {4096})}},
      1024);
  in.shard_places = {{.host = 1, .gpu = "A", .reads = {"A"}, .rdma = true}, {}};
  in.instances = {{.id = 0,
                   .workers = {{10, 1}, {11, 1}},
                   .places = {{.host = 1, .gpu = "B", .reads = {"B", "A"}},
                              {.host = 2, .gpu = "C", .rdma = true}}}};
  std::string why;
  auto p = make_plan(in, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->path(0, p->instances[0], 0), chunk_path::device_direct);
  EXPECT_EQ(p->path(0, p->instances[0], 1), chunk_path::gpudirect);
  const auto gpu_shard = p->copies_of(0);
  EXPECT_TRUE(gpu_shard.device && gpu_shard.device_written && !gpu_shard.host);
  const auto host_shard = p->copies_of(1);
  EXPECT_TRUE(host_shard.host && !host_shard.device);
  const auto n = p->paths();
  EXPECT_EQ(n.all, 4u);
  EXPECT_EQ(n.device_direct, 1u);
  EXPECT_EQ(n.gpudirect, 1u);
  in.instances[0].places.pop_back();  // a place for some workers only
  EXPECT_FALSE(make_plan(in, why));
  EXPECT_NE(why.find("instance 0 needs a place for every worker, or none"), std::string::npos)
      << why;
}

}  // namespace
}  // namespace ferry
