// Generation: prefill + one-token decoding gives the full forward's logits at every position, for
// every kernel and Gemma 1/2/3 (incl. Gemma 2/3 sliding windows and soft-caps); greedy generation
// reproduces transformers' generate(do_sample=False) token for token (fixtures written by
// tools/make_reference.py); sampling options behave as documented.
#include <gtest/gtest.h>

#include <iostream>

#include "attention/attention_config.h"
#include "attention/kernel_registry.h"
#include "model/gemma_model.h"
#include "model/generation.h"
#include "model/weights_io.h"
#include "test_support.h"
#include "util/config_reader.h"

namespace darkformer {
namespace {

GemmaModel LoadFixtureModel(const std::string& name) {
  const auto weights = testing::ConvertedFixture(name);
  auto model = GemmaModel(ReadWeightsConfig(weights));
  LoadWeights(weights, *model);
  return model;
}

// Max |a - b| over max |b|.
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

class DecodeEqualsForwardTest : public ::testing::TestWithParam<std::string> {};

// Every kernel with an incremental form whose outputs are deterministic (random draws fresh
// weights on every call by definition, so no two passes agree; it is checked separately below).
TEST_P(DecodeEqualsForwardTest, PrefillThenStepsGiveTheFullForwardLogits) {
  const std::string name = GetParam();
  auto model = LoadFixtureModel(name);
  const auto input_ids = ReadTensorH5(testing::SourceDir() + "/tests/fixtures/" + name + "/reference.h5", "input_ids");
  const auto ids_1L = input_ids.narrow(0, 0, 1);
  const int64_t length = ids_1L.size(1), prompt = 10;
  torch::NoGradGuard no_grad;
  for (const std::string kernel : {"exact", "performer", "darkformer", "lfk", "gerf", "saderf", "aderf", "sderf", "constant"}) {
    AttentionConfig attention;
    attention.kernel = kernel;
    model->SetAttention(attention);
    // Data-aware kernels (saderf, aderf, sderf) get their calibrated state, as a trainer gives it.
    model->ForEachAttentionInput(ids_1L, [&](const GemmaModelImpl::AttentionInput& in) {
      auto layer_kernel = in.attention.kernel();
      if (!layer_kernel->wants_calibration()) return;
      const auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
      layer_kernel->Calibrate(q_BHLD, k_BHLD, in.attention.call().scale);
    });
    const auto full_LV = model->forward(ids_1L)[0];
    auto cache = model->NewDecodeCache(length, torch::kCPU);
    std::vector<torch::Tensor> rows = {model->ForwardDecode(ids_1L.narrow(1, 0, prompt), cache)[0]};
    const int64_t bytes_after_prompt = cache.StateBytes();
    for (int64_t t = prompt; t < length; ++t) rows.push_back(model->ForwardDecode(ids_1L.narrow(1, t, 1), cache)[0]);
    // Random-feature and constant states do not grow with the context; the KV cache does.
    if (kernel == "exact") {
      EXPECT_GT(cache.StateBytes(), bytes_after_prompt) << name;
    } else {
      EXPECT_EQ(cache.StateBytes(), bytes_after_prompt) << name << " " << kernel;
    }
    const auto decoded_LV = torch::cat(rows, 0);
    const double error = RelativeError(decoded_LV, full_LV);
    std::cout << "[" << name << " " << kernel << "] decode vs forward: max |diff| / max |logit| = " << error << "\n";
    // Positive kernels: the forward runs the fast forms' scalar stabiliser and the steps the
    // per-feature one (docs/kernels.md, "The normaliser at any scale"); each is exact to fp32's
    // rounding of the log-feature arguments, which calibrated DERF features make the largest
    // (1.05e-5 for gemma2 saderf). The fp64 pass below shows the two are the same arithmetic.
    EXPECT_LE(error, kernel == "exact" || kernel == "constant" ? 1e-5 : 2e-5) << name << " " << kernel;
    EXPECT_EQ(cache.tokens, length);
  }
  // trig's and slay's features are signed: the sums have terms of both signs, so fp32 rounding of
  // the chunked and the step-by-step sums differs by up to ~1e-2 after cancellation on these random
  // weights. The two orders are the same arithmetic, which fp64 shows; so are the positive
  // kernels' two stabilisers (performer, saderf and aderf here, uncalibrated).
  for (const std::string kernel : {"trig", "slay", "flexformer", "performer", "saderf", "aderf"}) {
    AttentionConfig attention;
    attention.kernel = kernel;
    model->SetAttention(attention);
    model->to(torch::kFloat64);
    const auto full_LV = model->forward(ids_1L)[0];
    auto cache = model->NewDecodeCache(length, torch::kCPU);
    std::vector<torch::Tensor> rows = {model->ForwardDecode(ids_1L.narrow(1, 0, prompt), cache)[0]};
    const int64_t bytes_after_prompt = cache.StateBytes();
    for (int64_t t = prompt; t < length; ++t) rows.push_back(model->ForwardDecode(ids_1L.narrow(1, t, 1), cache)[0]);
    const double error = RelativeError(torch::cat(rows, 0), full_LV);
    std::cout << "[" << name << " " << kernel << ", fp64] decode vs forward: max |diff| / max |logit| = " << error << "\n";
    EXPECT_LE(error, 1e-9) << name << " " << kernel;
    EXPECT_EQ(cache.StateBytes(), bytes_after_prompt);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeEqualsForwardTest, ::testing::Values("gemma", "gemma2", "gemma3"));

TEST(DecodeTest, OneTokenAtATimeFarPastTheSlidingWindowMatchesTheForward) {
  // Gemma 2's fixture: window 8 on alternate layers; 40 tokens, no prefill, so the sliding
  // layers' caches are trimmed 32 times and full layers' grow to 40.
  auto model = LoadFixtureModel("gemma2");
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  const auto ids = torch::randint(0, 256, {1, 40}, torch::kLong);
  auto cache = model->NewDecodeCache(40, torch::kCPU);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < 40; ++t) rows.push_back(model->ForwardDecode(ids.narrow(1, t, 1), cache)[0]);
  EXPECT_LE(RelativeError(torch::cat(rows, 0), model->forward(ids)[0]), 1e-5);
  // KV cache: a full layer holds all 40 tokens, a sliding one the last window - 1 = 7.
  const auto& c = model->config();
  const int64_t per_token = 2 * c.num_key_value_heads * c.head_dim * 4;  // k and v, fp32
  int64_t expected = 0;
  for (const auto& type : c.layer_types) expected += (type == "sliding_attention" ? 7 : 40) * per_token;
  EXPECT_EQ(cache.StateBytes(), expected);
}

TEST(DecodeTest, RandomKernelDecodesConvexCombinationsOfEarlierValues) {
  // out_t = sum_{j <= t} u_tj v_j / sum u_tj: with v_j = j, every output lies in [0, t].
  KernelShape shape;
  shape.num_heads = 2;
  shape.head_dim = 4;
  auto kernel = MakeAttentionKernel("random", shape, ConfigReader(YAML::Load("{}"), "attention.random"));
  std::unique_ptr<DecodeState> state;
  AttentionCall call;
  const auto q = torch::zeros({1, 2, 1, 4});
  for (int64_t t = 0; t < 6; ++t) {
    const auto v = torch::full({1, 1, 1, 4}, static_cast<double>(t));
    const auto out = kernel->Decode(state, q, torch::zeros({1, 1, 1, 4}), v, call);
    EXPECT_GE(out.min().item<double>(), 0.0);
    EXPECT_LE(out.max().item<double>(), static_cast<double>(t) + 1e-6);
    if (t > 0) EXPECT_LT(out.max().item<double>(), static_cast<double>(t));  // earlier values get weight
  }
}

class GreedyMatchesTransformersTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyMatchesTransformersTest, SixtyFourTokens) {
  const std::string name = "generate-" + GetParam();
  auto model = LoadFixtureModel(name);
  const std::string reference = testing::SourceDir() + "/tests/fixtures/" + name + "/generate.h5";
  const auto prompt_t = ReadTensorH5(reference, "prompt").to(torch::kLong);
  const auto expected_t = ReadTensorH5(reference, "tokens").to(torch::kLong);
  const std::vector<int64_t> prompt(prompt_t.data_ptr<int64_t>(), prompt_t.data_ptr<int64_t>() + prompt_t.numel());
  const std::vector<int64_t> expected(expected_t.data_ptr<int64_t>(), expected_t.data_ptr<int64_t>() + expected_t.numel());
  SamplingOptions options;
  options.greedy = true;
  options.max_new_tokens = static_cast<int64_t>(expected.size());
  std::vector<int64_t> streamed;
  const auto result = Generate(model, prompt, options, [&](int64_t token) { streamed.push_back(token); });
  EXPECT_EQ(result.tokens, expected) << name;
  EXPECT_EQ(streamed, result.tokens);
}

INSTANTIATE_TEST_SUITE_P(Families, GreedyMatchesTransformersTest, ::testing::Values("gemma", "gemma2", "gemma3"));

TEST(SamplingTest, TopKTopPAndTemperatureRestrictTheDraws) {
  const auto logits = torch::tensor({4.0, 3.0, 2.0, 1.0, 0.0});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  SamplingOptions o;
  o.top_k = 2;
  for (int i = 0; i < 200; ++i) EXPECT_LT(SampleToken(logits, o, generator), 2);
  o = {};
  // softmax: 0.636, 0.234, 0.086, ...: top_p 0.8 keeps tokens 0 and 1 only.
  o.top_p = 0.8;
  for (int i = 0; i < 200; ++i) EXPECT_LT(SampleToken(logits, o, generator), 2);
  o = {};
  o.top_p = 0.5;  // token 0 alone already exceeds 0.5
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(logits, o, generator), 0);
  o = {};
  o.temperature = 1e-3;  // near-greedy
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(logits, o, generator), 0);
  o = {};
  o.greedy = true;
  EXPECT_EQ(SampleToken(logits, o, generator), 0);
  // Plain sampling follows the softmax: token 0's frequency near 0.636 over 4000 draws (5 sigma).
  o = {};
  int zeros = 0;
  for (int i = 0; i < 4000; ++i) zeros += SampleToken(logits, o, generator) == 0;
  const double p0 = torch::softmax(logits, 0)[0].item<double>();
  EXPECT_NEAR(zeros / 4000.0, p0, 5 * std::sqrt(p0 * (1 - p0) / 4000));
}

TEST(GenerateTest, BadInputsAreClearErrors) {
  GemmaConfig config;
  config.vocab_size = 32;
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.head_dim = 8;
  config.max_position_embeddings = 16;
  GemmaModel model(config);
  SamplingOptions o;
  auto message = [&](const std::vector<int64_t>& prompt, const SamplingOptions& options) {
    try {
      Generate(model, prompt, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}, o).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message(std::vector<int64_t>(16, 1), o).find("max_position_embeddings is 16"), std::string::npos);
  o.temperature = 0;
  EXPECT_NE(message({1, 2}, o).find("--temperature"), std::string::npos);
  o = {};
  o.top_p = 1.5;
  EXPECT_NE(message({1, 2}, o).find("--top-p"), std::string::npos);
  // Generation stops at the model's last position instead of running past it.
  o = {};
  o.max_new_tokens = 100;
  const auto result = Generate(model, {1, 2, 3}, o);
  EXPECT_EQ(result.tokens.size(), 14u);  // positions 3 .. 15 are fed, 16 is not: 13 + the first
}

}  // namespace
}  // namespace darkformer
