// Our Gemma 1/2/3 against Hugging Face transformers' numbers: the fixtures in tests/fixtures/ were
// written by tools/make_reference.py; here they are converted, loaded, run and compared.
#include <gtest/gtest.h>

#include <iostream>

#include "model/gemma_model.h"
#include "model/weights_io.h"
#include "test_support.h"

namespace darkformer {
namespace {

struct Loaded {
  GemmaModel model{nullptr};
  std::string reference;
};

Loaded LoadFixture(const std::string& name) {
  const auto weights = testing::ConvertedFixture(name);
  Loaded out;
  out.model = GemmaModel(ReadWeightsConfig(weights));
  LoadWeights(weights, *out.model);
  out.reference = testing::SourceDir() + "/tests/fixtures/" + name + "/reference.h5";
  return out;
}

class HfReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReferenceTest, LogitsLossAndGradientsMatch) {
  const std::string name = GetParam();
  auto loaded = LoadFixture(name);
  auto& model = loaded.model;
  const auto input_ids = ReadTensorH5(loaded.reference, "input_ids");
  const auto ref_logits = ReadTensorH5(loaded.reference, "logits");
  const double ref_loss = ReadTensorH5(loaded.reference, "loss").item<double>();

  const auto logits = model->forward(input_ids);
  const auto loss = CausalLmLoss(logits, ShiftedLabels(input_ids));
  loss.backward();

  const double logits_diff = (logits - ref_logits).abs().max().item<double>();
  const double loss_rel = std::abs(loss.item<double>() - ref_loss) / std::abs(ref_loss);
  std::cout << "[" << name << "] logits max |diff| = " << logits_diff << " (logits std " << ref_logits.std().item<double>()
            << "), loss " << loss.item<double>() << " vs HF " << ref_loss << " (rel " << loss_rel << ")\n";
  EXPECT_LE(logits_diff, 1e-4);
  EXPECT_LE(loss_rel, 1e-5);

  const auto params = model->named_parameters();
  for (const std::string param : {"embed_tokens.weight", "layers.1.self_attn.q_proj.weight",
                                  "layers.1.input_layernorm.weight", "layers.1.mlp.down_proj.weight"}) {
    const auto ref_grad = ReadTensorH5(loaded.reference, "grad/" + param);
    const auto grad = params[param].grad();
    ASSERT_TRUE(grad.defined()) << param;
    const double diff = (grad - ref_grad).abs().max().item<double>();
    std::cout << "[" << name << "] grad " << param << " max |diff| = " << diff << " (max |grad| "
              << ref_grad.abs().max().item<double>() << ")\n";
    EXPECT_LE(diff, 1e-4) << param;
  }
}

TEST_P(HfReferenceTest, Bfloat16ModelTracksFloat32) {
  const std::string name = GetParam();
  auto loaded = LoadFixture(name);
  const auto input_ids = ReadTensorH5(loaded.reference, "input_ids");
  const auto ref_logits = ReadTensorH5(loaded.reference, "logits");
  loaded.model->to(torch::kBFloat16);
  const auto logits = loaded.model->forward(input_ids);
  ASSERT_EQ(logits.scalar_type(), torch::kBFloat16);
  const auto diff = (logits.to(torch::kFloat32) - ref_logits).abs();
  const double relative = diff.mean().item<double>() / ref_logits.abs().mean().item<double>();
  std::cout << "[" << name << "] bf16 vs fp32 HF logits: mean |diff| / mean |logit| = " << relative << "\n";
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  // bf16 keeps 8 mantissa bits; through a few random layers a few percent is the expected drift.
  EXPECT_LE(relative, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Families, HfReferenceTest, ::testing::Values("gemma", "gemma2", "gemma3"));

}  // namespace
}  // namespace darkformer
