// Hugging Face parity on the test device: the fixtures of tests/fixtures/ (written by
// tools/make_reference.py from transformers on the CPU) converted, loaded onto the device (TF32
// off) and run: logits, loss and gradients within the CPU test's bounds (tests/model/hf_reference_test.cpp).
#include <execinfo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <iostream>

#include "cuda/test_device.h"
#include "model/gemma_model.h"
#include "model/test_support.h"
#include "model/weights_io.h"

namespace darkformer {
namespace {

class HfFixtureOnDeviceTest : public ::testing::TestWithParam<std::string> {};

// On a crash, the stack (libraries and offsets) to stderr before dying as before.
void PrintStackAndDie(int signal) {
  void* frames[64];
  const int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

TEST_P(HfFixtureOnDeviceTest, LogitsLossAndGradientsMatchTransformers) {
  std::signal(SIGSEGV, PrintStackAndDie);
  const std::string name = GetParam();
  // Each step says so as it ends: on the GPU machine this test once died of SIGSEGV unexplained.
  auto step = [&](const char* what) { std::cerr << "[" << name << "] " << what << std::endl; };
  testing::TempDir dir("hfdev-" + name);
  const auto weights = testing::ConvertFixture(name, dir);  // before CUDA starts in this process
  step("converted");
  const auto device = testing::TestDevice();
  GemmaModel model(ReadWeightsConfig(weights));
  LoadWeights(weights, *model);
  step("loaded");
  model->to(device);
  step("on the device");
  const auto reference = testing::SourceDir() + "/tests/fixtures/" + name + "/reference.h5";
  const auto input_ids = ReadTensorH5(reference, "input_ids").to(device);
  const auto ref_logits = ReadTensorH5(reference, "logits");
  const double ref_loss = ReadTensorH5(reference, "loss").item<double>();
  step("reference read");

  const auto logits = model->forward(input_ids);
  const auto loss = CausalLmLoss(logits, ShiftedLabels(input_ids));
  step("forward");
  loss.backward();
  step("backward");
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
    step(param.c_str());
  }
  step("compared");
}

INSTANTIATE_TEST_SUITE_P(Families, HfFixtureOnDeviceTest, ::testing::Values("gemma", "gemma2", "gemma3"));

}  // namespace
}  // namespace darkformer
