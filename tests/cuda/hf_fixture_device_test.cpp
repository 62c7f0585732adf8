// Hugging Face parity on the test device: the fixtures of tests/fixtures/ (written by
// tools/make_reference.py from transformers on the CPU) converted, loaded onto the device (TF32
// off) and run: logits, loss and gradients within the CPU test's bounds (tests/model/hf_reference_test.cpp).
#include <gtest/gtest.h>

#include <iostream>

#include "cuda/test_device.h"
#include "model/gemma_model.h"
#include "model/test_support.h"
#include "model/weights_io.h"

namespace darkformer {
namespace {

class HfFixtureOnDeviceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixtureOnDeviceTest, LogitsLossAndGradientsMatchTransformers) {
  const std::string name = GetParam();
  const auto weights = testing::ConvertedFixture(name);
  const auto device = testing::TestDevice();
  GemmaModel model(ReadWeightsConfig(weights));
  LoadWeights(weights, *model);
  model->to(device);
  const auto reference = testing::SourceDir() + "/tests/fixtures/" + name + "/reference.h5";
  const auto input_ids = ReadTensorH5(reference, "input_ids").to(device);
  const auto ref_logits = ReadTensorH5(reference, "logits");
  const double ref_loss = ReadTensorH5(reference, "loss").item<double>();

  const auto logits = model->forward(input_ids);
  const auto loss = CausalLmLoss(logits, ShiftedLabels(input_ids));
  loss.backward();
  const double logits_diff = (logits.cpu() - ref_logits).abs().max().item<double>();
  const double loss_rel = std::abs(loss.item<double>() - ref_loss) / std::abs(ref_loss);
  std::cerr << "[" << name << " on " << device.str() << "] logits max |diff| = " << logits_diff << ", loss rel "
            << loss_rel << std::endl;
  EXPECT_LE(logits_diff, 1e-4);
  EXPECT_LE(loss_rel, 1e-5);
  const auto params = model->named_parameters();
  for (const std::string param : {"embed_tokens.weight", "layers.1.self_attn.q_proj.weight",
                                  "layers.1.input_layernorm.weight", "layers.1.mlp.down_proj.weight"}) {
    const auto ref_grad = ReadTensorH5(reference, "grad/" + param);
    const auto grad = params[param].grad();
    ASSERT_TRUE(grad.defined()) << param;
    EXPECT_LE((grad.cpu() - ref_grad).abs().max().item<double>(), 1e-4) << param;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfFixtureOnDeviceTest, ::testing::Values("gemma", "gemma2", "gemma3"));

}  // namespace
}  // namespace darkformer
