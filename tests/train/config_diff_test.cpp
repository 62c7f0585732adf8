// Run configs compared key by key, as the run saw them (train/config_diff.h): defaults stand in
// for absent keys, numbers compare by value, and the first differing key is the one named.
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "train/config_diff.h"
#include "train/tiny_run.h"

namespace darkformer {
namespace {

TEST(ConfigDiffTest, AKeySetToItsDefaultEqualsTheKeyLeftOut) {
  testing::TempDir dir;
  const auto plain = testing::TinyRunConfig(dir.path(), "exact");
  ASSERT_FALSE(plain.resolved["train"]["grad_clip"]) << "the tiny config must leave train.grad_clip to its default";
  EXPECT_EQ(plain.defaults.at("train.grad_clip"), "1");
  for (const auto* same : {"train.grad_clip=1", "train.grad_clip=1.0", "train.grad_clip=1e0", "train.lr=0.01"}) {
    EXPECT_FALSE(FirstDifference(FlattenConfig(plain), FlattenConfig(testing::TinyRunConfig(dir.path(), "exact", {same}))))
        << same << " (the tiny config has lr 1.0e-2)";
  }
  const auto other = testing::TinyRunConfig(dir.path(), "exact", {"train.grad_clip=0.5"});
  const auto difference = FirstDifference(FlattenConfig(plain), FlattenConfig(other));
  ASSERT_TRUE(difference);
  EXPECT_EQ(difference->key, "train.grad_clip");
  EXPECT_EQ(difference->first, "1");
  EXPECT_EQ(difference->second, "0.5");
  // An enum's default is its name.
  EXPECT_FALSE(FirstDifference(FlattenConfig(plain),
                               FlattenConfig(testing::TinyRunConfig(dir.path(), "exact", {"train.precision=float32"}))));
}

TEST(ConfigDiffTest, TheFirstDifferenceInDocumentOrderIsNamedAndIgnoredKeysAreSkipped) {
  const FlatConfig a = {{"model.hidden_size", "32"}, {"train.steps", "4"}, {"train.deterministic", "yes"},
                        {"log.dir", "runs/a"}};
  FlatConfig b = {{"model.hidden_size", "32"}, {"train.steps", "8"}, {"train.deterministic", "true"},
                  {"log.dir", "runs/b"}, {"train.seed", "3"}};
  auto d = FirstDifference(a, b);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->key, "train.steps");
  d = FirstDifference(a, b, {"train.steps", "log"});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->key, "train.seed");  // present in the second only; yes == true
  EXPECT_EQ(d->first, "(not set)");
  EXPECT_EQ(d->second, "3");
  b.pop_back();
  EXPECT_FALSE(FirstDifference(a, b, {"train.steps", "log"}));
  EXPECT_FALSE(FirstDifference(a, b, {"train.steps", "log.dir"}));
  EXPECT_TRUE(FirstDifference(a, b, {"train.step", "log"})) << "a prefix matches whole keys only";
}

TEST(ConfigDiffTest, TheSerialisedFormRoundTripsAnyText) {
  const FlatConfig config = {{"a.b", "plain"}, {"c", "tab\there\nnewline \\ backslash"}, {"d", ""}, {"e", "[1, 2]"}};
  EXPECT_EQ(ParseFlatConfig(SerializeFlatConfig(config)), config);
}

}  // namespace
}  // namespace darkformer
