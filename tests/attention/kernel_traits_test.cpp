// The registry's traits, asked of the kernels: every registered kernel has exactly one family,
// and the facts the tests, tools and plug-in rely on hold (DARKFormer learns M, LFK learns W,
// Performer nothing; the option defaults are the ones the kernels read).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "attention/kernel_registry.h"
#include "attention/kernel_traits.h"

namespace darkformer {
namespace {

TEST(KernelTraits, EveryRegisteredKernelHasExactlyOneFamily) {
  std::multiset<std::string> seen;
  for (const auto family : {KernelFamily::kExact, KernelFamily::kPositive, KernelFamily::kSigned, KernelFamily::kBaseline}) {
    for (const auto& name : KernelNames(family)) seen.insert(name);
  }
  const auto all = KernelNames();
  EXPECT_EQ(std::vector<std::string>(seen.begin(), seen.end()), all);
  EXPECT_EQ(KernelNames(KernelFamily::kExact), std::vector<std::string>{"exact"});
  EXPECT_EQ(KernelNames(KernelFamily::kBaseline), (std::vector<std::string>{"constant", "random"}));
  for (const auto& name : KernelNames(KernelFamily::kPositive)) EXPECT_TRUE(TraitsOf(name).log_form) << name;
  for (const auto& name : KernelNames(KernelFamily::kSigned)) EXPECT_FALSE(TraitsOf(name).log_form) << name;
}

TEST(KernelTraits, WhatEachLearnsAndItsDefaults) {
  auto learns = [](const std::string& name) { return TraitsOf(name).learns; };
  EXPECT_TRUE(learns("performer").empty());
  EXPECT_TRUE(learns("exact").empty());
  EXPECT_EQ(learns("darkformer"), std::vector<std::string>{"M"});
  EXPECT_EQ(learns("lfk"), std::vector<std::string>{"W"});
  EXPECT_EQ(TraitsOf("performer").family, KernelFamily::kPositive);
  EXPECT_EQ(TraitsOf("trig").family, KernelFamily::kSigned);
  EXPECT_EQ(TraitsOf("performer").option_defaults.at("num_features"), "256");
  EXPECT_EQ(TraitsOf("exact").option_defaults.at("documents"), "auto");
  EXPECT_TRUE(TraitsOf("exact").supports_softcap);
}

TEST(KernelTraits, JsonCarriesTypedDefaults) {
  const auto json = ToJson(TraitsOf("darkformer"));
  EXPECT_EQ(json["name"], "darkformer");
  EXPECT_EQ(json["family"], "positive");
  EXPECT_EQ(json["options"]["num_features"], 256);
  EXPECT_TRUE(json["options"]["share_across_heads"].is_boolean());
  EXPECT_TRUE(json["options"]["op"].is_string());
}

}  // namespace
}  // namespace darkformer
