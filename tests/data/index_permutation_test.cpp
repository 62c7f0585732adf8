// Tests of the Feistel index permutation: a bijection for every size, fixed by its key.
#include "data/index_permutation.h"

#include <gtest/gtest.h>

#include <vector>

namespace darkformer {
namespace {

TEST(IndexPermutationTest, IsABijectionForManySizes) {
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 16ull, 17ull, 100ull, 1000ull, 4097ull, 65537ull}) {
    for (uint64_t key : {0ull, 1ull, 12345ull}) {
      IndexPermutation p(n, key);
      std::vector<bool> hit(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t j = p(i);
        ASSERT_LT(j, n);
        ASSERT_FALSE(hit[j]) << "n=" << n << " key=" << key << " collides at " << i;
        hit[j] = true;
      }
    }
  }
}

TEST(IndexPermutationTest, IsFixedByItsKeyAndShuffles) {
  const uint64_t n = 1000;
  IndexPermutation a(n, 42), b(n, 42), c(n, 43);
  int differ = 0, fixed_points = 0;
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a(i), b(i));
    differ += a(i) != c(i);
    fixed_points += a(i) == i;
  }
  EXPECT_GT(differ, 900);
  EXPECT_LT(fixed_points, 20);  // about 1 expected for a random permutation
}

}  // namespace
}  // namespace darkformer
