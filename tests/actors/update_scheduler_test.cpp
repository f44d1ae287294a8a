#include "actors/update_scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace ferry {
namespace {

const address worker_a{10, 1}, worker_b{11, 1};

job_membership two_trainers_two_workers() {
  job_membership m;
  m.trainers[0] = {.who = {1, 1}};
  m.trainers[1] = {.who = {2, 1}};
  m.workers[{0, 0}] = {.who = worker_a};
  m.workers[{0, 1}] = {.who = worker_b};
  return m;
}

TEST(update_scheduler, one_update_at_a_time_oldest_pending_first_skipping_failed_ones) {
  update_scheduler u;
  const auto members = two_trainers_two_workers();
  EXPECT_FALSE(u.next(members));
  u.published(3, 0);
  u.published(2, 1);
  EXPECT_EQ(u.next_version(), 4u);
  EXPECT_EQ(u.next(members)->version, 2u);
  EXPECT_TRUE(u.fail(2));
  EXPECT_FALSE(u.fail(2));  // once
  const auto next = u.next(members);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->version, 3u);
  EXPECT_FALSE(next->catch_up);
  u.start(*next);
  EXPECT_FALSE(u.next(members));  // one at a time
  EXPECT_EQ(u.complete().version, 3u);
  EXPECT_EQ(u.delivered(), 3u);
  EXPECT_TRUE(u.pending().empty());  // the failed 2 went with it
  EXPECT_FALSE(u.active());
}

TEST(update_scheduler,
     late_joiners_catch_up_unless_a_shard_holds_no_copy_of_the_delivered_version) {
  update_scheduler u;
  auto members = two_trainers_two_workers();
  u.published(1, 0);
  u.published(1, 1);
  u.start(*u.next(members));
  u.complete();
  members.workers[{0, 0}].complete_version = 1;
  u.published(2, 0);
  // Worker b lacks version 1: it catches up first, and a catch-up delivers nothing.
  const auto next = u.next(members);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->version, 1u);
  EXPECT_TRUE(next->catch_up);
  u.start(*next);
  EXPECT_EQ(u.complete().version, 1u);
  EXPECT_EQ(u.delivered(), 1u);
  EXPECT_EQ(u.pending(), std::set<std::uint64_t>{2});
  // A shard that rejoined after version 1 has no copy of it: the next update brings every chunk.
  members.trainers[1].first_version = 2;
  EXPECT_EQ(u.next(members)->version, 2u);
  EXPECT_FALSE(u.next(members)->catch_up);
}

TEST(update_scheduler, a_version_a_shard_went_past_without_publishing_is_skipped) {
  update_scheduler u;
  auto members = two_trainers_two_workers();
  u.published(2, 0);
  members.trainers[0].last_published = 2;
  u.published(3, 0);
  u.published(3, 1);
  members.trainers[0].last_published = 3;
  members.trainers[1].last_published = 3;
  const auto skipped = u.skipped(members);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].version, 2u);
  EXPECT_EQ(skipped[0].shard, 1u);
  EXPECT_EQ(skipped[0].shard_published, 3u);
}

TEST(update_scheduler, only_what_some_member_lacks_travels) {
  // Both workers hear every chunk: what either lacks goes through the leaders.
  plan_inputs in{.chunk_bytes = 1024,
                 .shards = {{1, 1}},
                 .shard_tensors = {{make_tensor_spec("w", dtype::f32, {1000}),
                                    make_tensor_spec("b", dtype::f32, {64})}},
                 .instances = {{.id = 0, .workers = {worker_a, worker_b}}}};
  std::string why;
  auto whole = make_plan(in, why);
  ASSERT_TRUE(whole) << why;
  ASSERT_GE(whole->chunks.size(), 3u);
  auto members = two_trainers_two_workers();
  members.workers[{0, 0}].complete_version = 5;
  members.workers[{0, 1}].partial_version = 5;
  members.workers[{0, 1}].partial_chunks = {0, 2};
  auto sends = update_scheduler::what_travels(*whole, whole->instances[0], members, 5);
  std::vector<std::uint32_t> lacking;
  for (std::uint32_t c = 0; c < whole->chunks.size(); ++c) {
    if (c != 0 && c != 2) lacking.push_back(c);
  }
  EXPECT_EQ(sends.through_leaders, lacking);
  EXPECT_TRUE(sends.direct[0].empty() && sends.direct[1].empty());
  members.workers[{0, 1}].complete_version = 5;
  EXPECT_TRUE(update_scheduler::what_travels(*whole, whole->instances[0], members, 5)
                  .through_leaders.empty());

  // A holds rows [0, 500) of w, B the rest; both hold b: each row chunk goes to its one hearer.
  in.select(worker_a, {{"w", {0, 2000}}, {"b", {0, 256}}});
  in.select(worker_b, {{"w", {2000, 2000}}, {"b", {0, 256}}});
  auto split = make_plan(in, why);
  ASSERT_TRUE(split) << why;
  members = two_trainers_two_workers();
  sends = update_scheduler::what_travels(*split, split->instances[0], members, 1);
  auto bytes = [&](const std::vector<std::uint32_t>& chunks) {
    std::uint64_t n = 0;
    for (auto c : chunks) {
      for (const auto& piece : split->chunks[c].pieces) n += piece.bytes;
    }
    return n;
  };
  const auto to_a = bytes(sends.direct[0]), to_b = bytes(sends.direct[1]),
             shared = bytes(sends.through_leaders);
  EXPECT_EQ(to_a, 2000u);
  EXPECT_EQ(to_b, 2000u);
  EXPECT_EQ(shared, 256u);
  EXPECT_EQ(sends.through_leaders.size() + sends.direct[0].size() + sends.direct[1].size(),
            split->chunks.size());
}

TEST(update_scheduler, each_trainer_is_ordered_every_route_with_only_its_own_chunks) {
  plan_inputs in{.chunk_bytes = 1024,
                 .shards = {{1, 1}, {2, 1}},
                 .shard_tensors = {{make_tensor_spec("a", dtype::f32, {1000})},
                                   {make_tensor_spec("b", dtype::f32, {700})}},
                 .instances = {{.id = 0, .workers = {worker_a, worker_b}}}};
  std::string why;
  const auto p = make_plan(in, why);
  ASSERT_TRUE(p) << why;
  std::vector<std::uint32_t> every, odd;
  for (std::uint32_t c = 0; c < p->chunks.size(); ++c) {
    every.push_back(c);
    if (c % 2) odd.push_back(c);
  }
  std::ranges::reverse(odd);  // a route's own order is kept, whatever it is
  const std::vector<route_chunks> routes{
      {.route = {.instance = 0, .leader = worker_a, .stripe = 0, .stripes = 2}, .chunks = every},
      {.route = {.instance = 0, .leader = worker_b, .stripe = 1, .stripes = 2}, .chunks = every},
      {.route = {.instance = 0, .leader = worker_b, .direct = true}, .chunks = odd},
      {.route = {.instance = 0, .leader = worker_a, .direct = true}, .chunks = {}}};

  const auto orders = update_scheduler::orders_by_shard(*p, 7, routes);
  ASSERT_EQ(orders.size(), 2u);
  for (std::uint32_t shard = 0; shard < 2; ++shard) {
    const auto& o = orders[shard];
    EXPECT_EQ(o.version, 7u);
    ASSERT_EQ(o.routes.size(), routes.size());  // every route, even one with none of its chunks
    for (std::size_t r = 0; r < routes.size(); ++r) {
      EXPECT_EQ(o.routes[r].route.leader, routes[r].route.leader);
      EXPECT_EQ(o.routes[r].route.stripe, routes[r].route.stripe);
      EXPECT_EQ(o.routes[r].route.direct, routes[r].route.direct);
      std::vector<std::uint32_t> own;
      for (const auto c : routes[r].chunks)
        if (p->chunks[c].shard == shard) own.push_back(c);
      EXPECT_EQ(o.routes[r].chunks, own) << "shard " << shard << ", route " << r;
    }
  }
  // Both shards source chunks, so the split is not trivial.
  EXPECT_FALSE(orders[0].routes[0].chunks.empty());
  EXPECT_FALSE(orders[1].routes[0].chunks.empty());
  EXPECT_EQ(orders[0].routes[0].chunks.size() + orders[1].routes[0].chunks.size(), every.size());
}

}  // namespace
}  // namespace ferry
