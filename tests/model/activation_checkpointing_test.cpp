// Activation checkpointing per decoder layer: the loss and every gradient equal those without it
// (fp32, 1e-6 relative), with every parameter trainable and with q/k/v (and the kernel) only;
// under bf16 autocast too (the recomputation replays the forward's autocast state); the random
// baseline's draws are replayed; and fewer bytes stay alive between forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/ThreadLocalDebugInfo.h>

#include <map>

#include "util/peak_memory.h"
#include "model/gemma_model.h"
#include "util/mixed_precision.h"
#include "tiny_gemma.h"

namespace darkformer {
namespace {

struct Result {
  double loss;
  std::map<std::string, torch::Tensor> grads;
  int64_t bytes_after_forward;
};

// One forward and backward of a fresh model (same init every time).
Result ForwardBackward(const std::string& kernel, bool checkpointing, bool qkv_only, bool autocast) {
  GemmaModel model(testing::TinyGemmaConfig(3), testing::TinyAttentionConfig(kernel, 3));
  model->InitializeWeights(0.2, 5);
  for (auto& item : model->named_parameters()) {
    const auto& name = item.key();
    auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    const bool qkv = has("self_attn.q_proj") || has("self_attn.k_proj") || has("self_attn.v_proj");
    const bool train = !qkv_only || qkv || has(".kernel.");
    item.value().set_requires_grad(train);
  }
  model->SetActivationCheckpointing(checkpointing);
  torch::manual_seed(9);
  const auto ids = torch::randint(0, 96, {2, 40}, torch::kLong);  // 40 tokens: 5 chunks of 8
  const auto labels = ShiftedLabels(ids);
  Result r;
  torch::Tensor loss;
  auto info = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    AutocastScope scope(torch::kCPU, autocast);
    loss = CausalLmLoss(model->forward(ids), labels);
  }
  r.bytes_after_forward = info->current();
  loss.backward();
  r.loss = loss.item<double>();
  for (const auto& item : model->named_parameters()) {
    if (item.value().grad().defined()) r.grads[item.key()] = item.value().grad().clone();
  }
  return r;
}

void ExpectSame(const Result& plain, const Result& checkpointed, const std::string& what) {
  EXPECT_LE(std::abs(checkpointed.loss - plain.loss), 1e-6 * std::abs(plain.loss)) << what;
  ASSERT_EQ(checkpointed.grads.size(), plain.grads.size()) << what;
  ASSERT_FALSE(plain.grads.empty());
  for (const auto& [name, g] : plain.grads) {
    ASSERT_TRUE(checkpointed.grads.count(name)) << what << ": " << name << " got no gradient with checkpointing";
    const double scale = g.abs().max().item<double>();
    const double diff = (checkpointed.grads.at(name) - g).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * scale + 1e-12) << what << ": " << name;
  }
}

class ActivationCheckpointingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ActivationCheckpointingTest, LossAndEveryGradientEqualWithoutIt) {
  for (const bool qkv_only : {false, true}) {
    const std::string what = GetParam() + (qkv_only ? " q/k/v only" : " all trainable");
    const auto plain = ForwardBackward(GetParam(), false, qkv_only, false);
    const auto checkpointed = ForwardBackward(GetParam(), true, qkv_only, false);
    ExpectSame(plain, checkpointed, what);
    if (qkv_only) {
      EXPECT_FALSE(plain.grads.count("embed_tokens.weight"));
      EXPECT_TRUE(checkpointed.grads.count("layers.0.self_attn.v_proj.weight")) << what;
    }
    std::printf("[checkpointing] %s: %lld bytes alive after the forward without, %lld with\n", what.c_str(),
                static_cast<long long>(plain.bytes_after_forward),
                static_cast<long long>(checkpointed.bytes_after_forward));
    EXPECT_LT(checkpointed.bytes_after_forward, plain.bytes_after_forward) << what;
  }
}

TEST_P(ActivationCheckpointingTest, EqualUnderBf16Autocast) {
  const auto plain = ForwardBackward(GetParam(), false, false, true);
  const auto checkpointed = ForwardBackward(GetParam(), true, false, true);
  ExpectSame(plain, checkpointed, GetParam() + " bf16 autocast");
}

INSTANTIATE_TEST_SUITE_P(Kernels, ActivationCheckpointingTest,
                         ::testing::Values("exact", "performer", "darkformer", "random", "constant"));

}  // namespace
}  // namespace darkformer
