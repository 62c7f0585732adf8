// Which trainable parameters a kernel leaves without a gradient, in a tiny Gemma: none, except the
// q/k projections of a kernel that ignores queries and keys, exactly as its trait says. The
// data-parallel Reducer relies on it: train.distributed.find_unused_parameters: auto searches for
// parameters without a gradient only where a layer's kernel has reads_queries_and_keys false.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "attention/kernel_registry.h"
#include "attention/kernel_traits.h"
#include "tiny_gemma.h"

namespace darkformer {
namespace {

constexpr int64_t kLayers = 2;

// Trainable parameters whose gradient is undefined after one forward and backward of a loss that
// reads every logit.
std::vector<std::string> WithoutGradient(const std::string& kernel) {
  GemmaModel model(testing::TinyGemmaConfig(kLayers), testing::TinyAttentionConfig(kernel, kLayers));
  model->InitializeWeights(0.1, 5);
  const auto ids = torch::arange(12, torch::kLong).remainder(96).reshape({1, 12});
  model->forward(ids).pow(2).mean().backward();
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad() && !item.value().grad().defined()) names.push_back(item.key());
  }
  return names;
}

TEST(GradientReach, OnlyKernelsThatIgnoreQueriesAndKeysLeaveParametersWithoutGradient) {
  std::vector<std::string> qk;
  for (int64_t i = 0; i < kLayers; ++i) {
    for (const std::string proj : {"q_proj", "k_proj"}) {
      qk.push_back("layers." + std::to_string(i) + ".self_attn." + proj + ".weight");
    }
  }
  for (const auto& name : KernelNames()) {
    const auto& traits = TraitsOf(name);
    // The baselines are the kernels whose attention weights ignore q and k (kernel_traits.h).
    EXPECT_EQ(traits.reads_queries_and_keys, traits.family != KernelFamily::kBaseline) << name;
    const auto without = WithoutGradient(name);
    EXPECT_EQ(without, traits.reads_queries_and_keys ? std::vector<std::string>{} : qk) << name;
  }
}

}  // namespace
}  // namespace darkformer
