#include "actors/direct_slot_grants.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ferry {
namespace {

address trainer(std::uint32_t shard) {
  return {.node = 100 + shard, .actor = 1};
}

struct sent_grant {
  std::uint32_t shard;
  std::uint32_t chunk;
  std::uint32_t slot;
  bool operator==(const sent_grant&) const = default;
};

std::vector<sent_grant> grant_all(direct_slot_grants& grants) {
  std::vector<sent_grant> out;
  grants.grant_free_slots([&](const address& to, const slot_grant& g) {
    out.push_back({.shard = to.node - 100, .chunk = g.chunk, .slot = g.slot});
  });
  return out;
}

TEST(direct_slot_grants, slots_go_round_the_shards_from_the_first_one_and_wait_when_none_is_free) {
  direct_slot_grants grants(2, 4, 2);
  for (std::uint32_t shard : {0u, 1u, 3u, 2u})
    grants.request(trainer(shard), shard, {.version = 1, .chunk = 10 + shard});
  EXPECT_EQ(grant_all(grants), (std::vector<sent_grant>{{2, 12, 0}, {3, 13, 1}}));
  EXPECT_TRUE(grant_all(grants).empty()) << "both slots are taken";
  ASSERT_TRUE(grants.granted(1));
  EXPECT_EQ(grants.granted(1)->trainer, trainer(3));
  EXPECT_EQ(grants.granted(1)->chunk, 13u);
  grants.release(0);
  EXPECT_FALSE(grants.granted(0));
  EXPECT_EQ(grant_all(grants), (std::vector<sent_grant>{{0, 10, 0}}))
      << "after shard 3 comes shard 0";
  grants.release(1);
  grants.release(0);
  EXPECT_EQ(grant_all(grants), (std::vector<sent_grant>{{1, 11, 1}}));
}

TEST(direct_slot_grants, one_shard_asking_twice_is_granted_in_the_order_it_asked) {
  direct_slot_grants grants(4, 2, 0);
  grants.request(trainer(1), 1, {.version = 3, .chunk = 7});
  grants.request(trainer(1), 1, {.version = 3, .chunk = 5});
  grants.request(trainer(0), 0, {.version = 3, .chunk = 2});
  EXPECT_EQ(grant_all(grants), (std::vector<sent_grant>{{0, 2, 0}, {1, 7, 1}, {1, 5, 2}}));
}

TEST(direct_slot_grants, no_slots_grant_nothing) {
  direct_slot_grants grants;
  grants.request(trainer(0), 0, {.version = 1, .chunk = 1});
  EXPECT_TRUE(grant_all(grants).empty());
  EXPECT_EQ(grants.count(), 0u);
}

}  // namespace
}  // namespace ferry
