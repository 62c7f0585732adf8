// Kernels inside a tiny Gemma: swapping a kernel into a model loaded from exact-attention weights
// leaves every other parameter untouched; darkformer at identity init with performer's draws gives
// performer's outputs; drawn state survives a save/load; a bf16 model stays finite.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "attention/feature_kernel_base.h"
#include "model/gemma_model.h"
#include "model/weights_io.h"

namespace darkformer {
namespace {

GemmaConfig TinyConfig() {
  GemmaConfig c;
  c.family = "gemma";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  return c;
}

AttentionConfig Attention(const std::string& yaml) {
  return AttentionConfig::FromConfig(ConfigReader(YAML::Load(yaml), "attention"), 2);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("darkformer_" + std::to_string(::getpid()) + "_" + name)).string();
}

WeightsLoadOptions Swap() {
  WeightsLoadOptions o;
  o.kernel_state_optional = true;
  return o;
}

class ModelSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    exact_ = GemmaModel(TinyConfig(), Attention("{kernel: exact}"));
    exact_->InitializeWeights(0.1, 17);
    path_ = TempPath("exact.h5");
    SaveWeights(path_, *exact_);
    ids_ = torch::randint(0, 64, {2, 21}, torch::TensorOptions().dtype(torch::kLong));
  }
  void TearDown() override { std::remove(path_.c_str()); }

  GemmaModel Loaded(const std::string& attention_yaml) {
    GemmaModel model(TinyConfig(), Attention(attention_yaml));
    LoadWeights(path_, *model, Swap());
    return model;
  }

  GemmaModel exact_{nullptr};
  std::string path_;
  torch::Tensor ids_;
};

TEST_F(ModelSwapTest, SwapLeavesOtherParametersUntouched) {
  const auto reference = exact_->named_parameters();
  for (const std::string kernel : {"performer", "darkformer", "lfk", "random", "constant"}) {
    auto model = Loaded("{kernel: " + kernel + ", " + kernel + ": {}}");
    // And the in-place swap of a live model.
    auto live = Loaded("{kernel: exact}");
    live->SetAttention(Attention("{kernel: " + kernel + "}"));
    int64_t compared = 0;
    for (auto* m : {&model, &live}) {
      for (const auto& item : (*m)->named_parameters()) {
        if (item.key().find(".kernel.") != std::string::npos) continue;
        ASSERT_TRUE(reference.contains(item.key())) << item.key();
        EXPECT_TRUE(torch::equal(item.value(), reference[item.key()])) << kernel << ": " << item.key();
        ++compared;
      }
    }
    std::cout << "[swap] " << kernel << ": " << compared << " non-kernel parameters identical to the exact model\n";
    EXPECT_EQ(compared, 2 * static_cast<int64_t>(reference.size()));
    EXPECT_TRUE(torch::isfinite(model->forward(ids_)).all().item<bool>());
  }
}

TEST_F(ModelSwapTest, DarkformerIdentityEqualsPerformerWithSameDraws) {
  for (const std::string projection : {"orthogonal", "iid"}) {
    const std::string opts = "num_features: 32, chunk_size: 8, seed: 5, projection: " + projection;
    auto performer = Loaded("{kernel: performer, performer: {" + opts + "}}");
    // A shared M takes Performer's exact code path (key features once per KV head): bit-identical.
    auto shared = Loaded("{kernel: darkformer, darkformer: {share_across_heads: true, " + opts + "}}");
    // A per-head M under MQA computes key features once per query head: the same sums in another
    // reduction layout, so compare in float64, where layout rounding is ~1e-16.
    auto per_head = Loaded("{kernel: darkformer, darkformer: {" + opts + "}}");
    torch::NoGradGuard no_grad;
    const auto a = performer->forward(ids_);
    const double err_shared = (a - shared->forward(ids_)).abs().max().item<double>();
    performer->to(torch::kFloat64);
    per_head->to(torch::kFloat64);
    const double err_per_head = (performer->forward(ids_) - per_head->forward(ids_)).abs().max().item<double>();
    std::cout << "[identity] " << projection << ": max|darkformer(M = I) - performer| logits: shared M " << err_shared
              << " (fp32), per-head M " << err_per_head << " (fp64)\n";
    EXPECT_EQ(err_shared, 0.0);
    EXPECT_LT(err_per_head, 1e-12);
  }
}

TEST_F(ModelSwapTest, DrawnStateSurvivesSaveAndLoad) {
  auto model = Loaded("{kernel: performer, performer: {num_features: 16, redraw: every_step}}");
  for (int64_t steps_done = 1; steps_done <= 3; ++steps_done) {
    for (int64_t i = 0; i < 2; ++i) model->attention_layer(i)->kernel()->before_train_step(steps_done);
  }
  const auto saved = TempPath("performer.h5");
  SaveWeights(saved, *model);
  // A different seed option: the file's draws and seeds win.
  GemmaModel reloaded(TinyConfig(), Attention("{kernel: performer, performer: {num_features: 16, seed: 99}}"));
  LoadWeights(saved, *reloaded);
  std::remove(saved.c_str());
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model->forward(ids_), reloaded->forward(ids_)));
  auto kernel = std::dynamic_pointer_cast<FeatureKernelBase>(reloaded->attention_layer(1)->kernel().ptr());
  EXPECT_EQ(kernel->draw_count(), 3);
}

TEST_F(ModelSwapTest, Bfloat16ModelIsFinite) {
  for (const std::string kernel : {"performer", "darkformer", "lfk"}) {
    auto model = Loaded("{kernel: " + kernel + "}");
    model->to(torch::kBFloat16);
    {
      // Larger query/key norms than training ever sees.
      torch::NoGradGuard no_grad;
      for (int64_t i = 0; i < 2; ++i) {
        model->attention_layer(i)->q_proj->weight.mul_(20);
        model->attention_layer(i)->k_proj->weight.mul_(20);
      }
    }
    const auto logits = model->forward(ids_);
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    CausalLmLoss(logits, ShiftedLabels(ids_)).backward();
    bool finite = torch::isfinite(logits).all().item<bool>();
    for (const auto& p : model->parameters()) finite = finite && (!p.grad().defined() || torch::isfinite(p.grad()).all().item<bool>());
    std::cout << "[bf16 model] " << kernel << ": logits and gradients finite = " << finite << "\n";
    EXPECT_TRUE(finite) << kernel;
  }
}

TEST(AttentionConfigTest, UnknownKernelListsValidOnes) {
  try {
    Attention("{kernel: favor}");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string text = e.what();
    std::cout << "[errors] " << text << "\n";
    for (const std::string name : {"aderf", "constant", "darkformer", "exact", "flexformer", "gerf", "lfk", "performer", "random", "saderf", "sderf", "slay", "trig"})
      EXPECT_NE(text.find(name), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace darkformer
