// The chunked LM-head cross-entropy equals the full-logit one (loss, both gradients, evaluation
// sums), with and without Gemma 2's soft-cap and with ignored labels; at a 256k vocabulary its
// peak bytes drop (LibTorch's allocator reports, util/peak_memory.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/ThreadLocalDebugInfo.h>

#include "util/peak_memory.h"
#include "model/gemma_model.h"
#include "model/linear_cross_entropy.h"
#include "util/labels.h"
#include "util/mixed_precision.h"

namespace darkformer {
namespace {

torch::Tensor FullLossSum(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& labels, double cap) {
  auto logits = torch::matmul(h, w.t());
  if (cap > 0) logits = torch::tanh(logits / cap) * cap;
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32), labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

struct Inputs {
  torch::Tensor h, w, labels;
};

Inputs MakeInputs(int64_t rows, int64_t hidden, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in{torch::randn({rows, hidden}), torch::randn({vocab, hidden}) * 0.3,
            torch::randint(0, vocab, {rows}, torch::kLong)};
  in.labels.index_put_({torch::arange(0, rows, 5)}, kIgnoreIndex);  // every fifth row ignored
  return in;
}

class LinearCrossEntropyTest : public ::testing::TestWithParam<double> {};  // the soft-cap (0: none)

TEST_P(LinearCrossEntropyTest, LossAndGradientsEqualTheFullLogits) {
  const double cap = GetParam();
  for (const int64_t chunk : {1, 7, 16, 1000}) {
    const auto in = MakeInputs(37, 16, 50, 3);
    const auto h1 = in.h.clone().requires_grad_(), w1 = in.w.clone().requires_grad_();
    const auto h2 = in.h.clone().requires_grad_(), w2 = in.w.clone().requires_grad_();
    const auto full = FullLossSum(h1, w1, in.labels, cap);
    full.backward();
    const auto chunked = LinearCrossEntropySum(h2, w2, in.labels, {chunk, cap});
    (chunked * 0.5).backward();  // the incoming gradient scales both
    EXPECT_LE(RelativeError(chunked, full), 1e-6) << "chunk " << chunk;
    EXPECT_LE(RelativeError(h2.grad() * 2, h1.grad()), 1e-6) << "chunk " << chunk;
    EXPECT_LE(RelativeError(w2.grad() * 2, w1.grad()), 1e-6) << "chunk " << chunk;
    // Ignored rows get no gradient.
    EXPECT_EQ(h2.grad()[0].abs().max().item<double>(), 0.0);
  }
}

TEST_P(LinearCrossEntropyTest, FrozenHeadGetsNoGradientAndEvalSumsMatch) {
  const double cap = GetParam();
  const auto in = MakeInputs(29, 8, 40, 5);
  const auto h = in.h.clone().requires_grad_();
  const auto w = in.w.clone();  // frozen (q/k/v-only finetuning of a tied head)
  LinearCrossEntropySum(h, w, in.labels, {6, cap}).backward();
  EXPECT_TRUE(h.grad().defined());
  EXPECT_FALSE(w.grad().defined());

  const auto stats = LinearCrossEntropyEval(in.h, in.w, in.labels, {6, cap});
  auto logits = torch::matmul(in.h, in.w.t());
  if (cap > 0) logits = torch::tanh(logits / cap) * cap;
  const auto mask = in.labels.ne(kIgnoreIndex);
  ASSERT_EQ(stats.scalar_type(), torch::kFloat64);
  EXPECT_NEAR(stats[0].item<double>(), FullLossSum(in.h, in.w, in.labels, cap).item<double>(), 1e-4);
  EXPECT_EQ(stats[1].item<double>(), (logits.argmax(-1).eq(in.labels) & mask).sum().item<double>());
  EXPECT_EQ(stats[2].item<double>(), mask.sum().item<double>());
}

INSTANTIATE_TEST_SUITE_P(Softcap, LinearCrossEntropyTest, ::testing::Values(0.0, 3.0));

// Under autocast the head's products run in bf16 as the full-logit path's do: the two agree to
// bf16's precision, and the gradients come back in the inputs' dtypes.
TEST(LinearCrossEntropyAutocastTest, MatchesTheFullLogitsUnderAutocast) {
  const auto in = MakeInputs(33, 16, 64, 7);
  const auto h1 = in.h.clone().requires_grad_(), w1 = in.w.clone().requires_grad_();
  const auto h2 = in.h.clone().requires_grad_(), w2 = in.w.clone().requires_grad_();
  torch::Tensor full, chunked;
  {
    AutocastScope autocast(torch::kCPU, true);
    full = FullLossSum(h1, w1, in.labels, 0.0);
    chunked = LinearCrossEntropySum(h2, w2, in.labels, {8, 0.0});
  }
  full.backward();
  chunked.backward();
  EXPECT_LE(RelativeError(chunked, full), 1e-2);
  EXPECT_LE(RelativeError(h2.grad(), h1.grad()), 2e-2);
  EXPECT_LE(RelativeError(w2.grad(), w1.grad()), 2e-2);
  EXPECT_EQ(h2.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(w2.grad().scalar_type(), torch::kFloat32);
}

// 128 tokens at Gemma's 256,000-piece vocabulary: the full path holds the 128 x 256k fp32 logits
// and their log-softmax (131 MB each); the chunked one a few 16 x 256k blocks plus dW.
TEST(LinearCrossEntropyMemoryTest, PeakBytesDropAtA256kVocabulary) {
  const auto in = MakeInputs(128, 32, 256000, 11);
  auto peak_of = [&](bool chunked) {
    const auto h = in.h.clone().requires_grad_(), w = in.w.clone().requires_grad_();
    auto info = std::make_shared<PeakMemory>();
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
      const auto loss = chunked ? LinearCrossEntropySum(h, w, in.labels, {16, 0.0}) : FullLossSum(h, w, in.labels, 0.0);
      loss.backward();
    }
    return info->peak();
  };
  const int64_t full = peak_of(false), chunked = peak_of(true);
  const int64_t logits_bytes = 128LL * 256000 * 4, weight_bytes = 256000LL * 32 * 4;
  std::printf("[peak bytes, 128 tokens x 256k vocab] full logits %.1f MB, chunked (16 rows) %.1f MB; "
              "logits %.1f MB, dW %.1f MB\n",
              full / 1e6, chunked / 1e6, logits_bytes / 1e6, weight_bytes / 1e6);
  EXPECT_GE(full, 2 * logits_bytes);  // the logits and their log-softmax at least
  // Chunked: dW (as the full path's weight gradient) plus a handful of 16-row blocks.
  EXPECT_LE(chunked, weight_bytes * 2 + 6 * 16LL * 256000 * 4);
  EXPECT_LT(chunked * 2, full);
}

}  // namespace
}  // namespace darkformer
