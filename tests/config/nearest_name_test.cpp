// "Did you mean": the nearest declared name, only when it is close enough to be the intent.
#include <gtest/gtest.h>

#include "util/nearest_name.h"

namespace darkformer {
namespace {

TEST(NearestName, EditDistanceCountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("lr", "lrr"), 1u);
  EXPECT_EQ(EditDistance("window", "windw"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("seq_len", "seq_lne"), 1u);  // neighbours swapped
}

TEST(NearestName, SuggestsOnlyCloseNames) {
  const std::vector<std::string> train = {"lr", "steps", "seed", "warmup_steps", "grad_clip", "keep_last"};
  EXPECT_EQ(NearestName("lrr", train), "lr");
  EXPECT_EQ(NearestName("step", train), "steps");
  EXPECT_EQ(NearestName("STEPS", train), "steps");
  EXPECT_EQ(NearestName("warmup_step", train), "warmup_steps");
  EXPECT_EQ(NearestName("x", train), "");
  EXPECT_EQ(NearestName("learning_rate", train), "");
  EXPECT_EQ(NearestName("perfomer", {"exact", "performer", "darkformer"}), "performer");
}

TEST(NearestName, FallsBackToTheOneNameTheGivenOneBegins) {
  EXPECT_EQ(NearestName("bf16", {"float32", "bf16_autocast"}), "bf16_autocast");
  EXPECT_EQ(NearestName("chunk", {"chunk_loop", "chunk_parallel"}), "");  // two begin so: no guess
  EXPECT_EQ(NearestName("bf", {"float32", "bf16_autocast"}), "");         // too short to guess from
}

TEST(NearestName, DidYouMeanPrefixesTheSection) {
  EXPECT_EQ(DidYouMean("lrr", {"lr"}, "train."), "; did you mean 'train.lr'?");
  EXPECT_EQ(DidYouMean("zzz", {"lr"}, "train."), "");
}

}  // namespace
}  // namespace darkformer
