#include <gtest/gtest.h>

#include "collectives/broadcast.hpp"

namespace ferry {
namespace {

/// The stripes of every split tile the buffer in order, without gaps or overlap.
TEST(stripe_of, stripes_tile_the_buffer) {
  for (std::uint64_t bytes :
       {1ull, 255ull, 256ull, 512ull, 1000ull, 64ull << 20, (64ull << 20) + 7}) {
    for (std::uint32_t k = 1; k <= 8; ++k) {
      std::uint64_t next = 0;
      for (std::uint32_t s = 0; s < k; ++s) {
        const auto part = stripe_of(bytes, k, s);
        EXPECT_EQ(part.offset, next) << bytes << " bytes, stripe " << s << " of " << k;
        next += part.bytes;
      }
      EXPECT_EQ(next, bytes) << bytes << " bytes in " << k << " stripes";
    }
  }
}

TEST(stripe_of, stripes_start_256_byte_aligned_and_only_the_last_ones_are_short) {
  const auto a = stripe_of(64ull << 20, 3, 0);
  const auto b = stripe_of(64ull << 20, 3, 1);
  const auto c = stripe_of(64ull << 20, 3, 2);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(b.offset % 256, 0u);
  EXPECT_EQ(c.offset % 256, 0u);
  EXPECT_LT(c.bytes, a.bytes);
  // 512 bytes in 3: two full stripes of 256, the third empty.
  EXPECT_EQ(stripe_of(512, 3, 1).bytes, 256u);
  EXPECT_EQ(stripe_of(512, 3, 2).bytes, 0u);
  EXPECT_EQ(stripe_of(512, 3, 2).offset, 512u);
}

}  // namespace
}  // namespace ferry
