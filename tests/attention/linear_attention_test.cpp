// Chunked causal linear attention against the explicit masked quadratic form built from the same
// features, and the causal safety of the stabiliser.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/causal_linear_attention.h"
#include "attention/positive_features.h"
#include "rounding_bounds.h"

namespace darkformer {
namespace {

// The slow, obvious reference in fp64: a_ij = q_i.k_j exp(b_j) (j <= i when causal), normalised.
torch::Tensor QuadraticReference(const torch::Tensor& q_BHLM, const torch::Tensor& k_BHLM, const torch::Tensor& b_BHL,
                                 const torch::Tensor& v_BHLD, bool causal) {
  const auto q = q_BHLM.to(torch::kFloat64), k = k_BHLM.to(torch::kFloat64), v = v_BHLD.to(torch::kFloat64);
  auto a_BHLL = torch::matmul(q, k.transpose(-1, -2)) * torch::exp(b_BHL.to(torch::kFloat64)).unsqueeze(-2);
  if (causal) a_BHLL = a_BHLL.tril();
  return torch::matmul(a_BHLL, v) / a_BHLL.sum(-1, true);
}

struct Inputs {
  torch::Tensor q_BHLM, k_BHLM, b_BHL, v_BHLD;
};

// The fp32 chunked form against the fp64 quadratic form of the same fp32 inputs (rounding_bounds.h):
// every weight q_i.k_j e^(b_j - r_i) is positive; its scale passes through at most N + 2 exps and
// products (N chunks: the state is rescaled once per chunk) whose arguments add up to at most
// 2 max|b|, and each term is summed over the m features and the L positions after 3 products.
double RoundingBound(const Inputs& in, int64_t chunk) {
  const int64_t m = in.q_BHLM.size(-1), length = in.q_BHLM.size(2), chunks = (length + chunk - 1) / chunk;
  const double scale_error = testing::ScaleChainError(chunks + 2, 2 * in.b_BHL.abs().max().item<double>());
  return testing::PositiveAverageBound(scale_error, m + length + 3, in.v_BHLD.abs().max().item<double>());
}

Inputs RandomInputs(int64_t length, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t batch = 2, heads = 3, m = 16, d = 8;
  return {torch::rand({batch, heads, length, m}) + 0.05, torch::rand({batch, heads, length, m}) + 0.05,
          3.0 * torch::randn({batch, heads, length}), torch::randn({batch, heads, length, d})};
}

TEST(LinearAttentionTest, CausalChunkedMatchesMaskedQuadraticForm) {
  const int64_t length = 37;
  const auto in = RandomInputs(length, 1);
  const auto reference = QuadraticReference(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD, true);
  for (int64_t chunk : {1, 3, 7, 16, 37, 64}) {
    const auto out = LinearAttention(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD, true, chunk);
    ASSERT_EQ(out.scalar_type(), torch::kFloat32);
    const double err = (out.to(torch::kFloat64) - reference).abs().max().item<double>();
    const double bound = RoundingBound(in, chunk);
    std::cout << "[causal linear] L=" << length << " chunk=" << chunk << " max|chunked - quadratic| = " << err
              << " (bound " << bound << ")\n";
    EXPECT_LE(err, bound) << "chunk " << chunk;
  }
}

TEST(LinearAttentionTest, NonCausalMatchesQuadraticForm) {
  const auto in = RandomInputs(29, 2);
  const auto reference = QuadraticReference(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD, false);
  const auto out = LinearAttention(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD, false, 8);
  const double err = (out.to(torch::kFloat64) - reference).abs().max().item<double>();
  const double bound = RoundingBound(in, in.q_BHLM.size(2));  // one exp per key against the global max
  std::cout << "[non-causal linear] max|linear - quadratic| = " << err << " (bound " << bound << ")\n";
  EXPECT_LE(err, bound);
}

TEST(LinearAttentionTest, BfloatValuesAreSummedInFloat32) {
  const auto in = RandomInputs(20, 3);
  const auto out = LinearAttention(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD.to(torch::kBFloat16), true, 8);
  EXPECT_EQ(out.scalar_type(), torch::kFloat32);
  const auto reference = QuadraticReference(in.q_BHLM, in.k_BHLM, in.b_BHL, in.v_BHLD.to(torch::kBFloat16), true);
  // bf16 values are exact in fp32: the fp32 bound (v's rounding included, harmlessly).
  EXPECT_LE((out.to(torch::kFloat64) - reference).abs().max().item<double>(), RoundingBound(in, 8));
}

// Later keys with enormous norms must not move earlier outputs: with a max over the whole sequence
// (the public Performer code) they would underflow every earlier key.
TEST(LinearAttentionTest, HugeLaterKeysLeaveEarlierOutputsUnchanged) {
  torch::manual_seed(4);
  const int64_t length = 24, t = 10, d = 8, m = 32;
  const auto w_MD = torch::randn({m, d});
  const auto x_BHLD = 0.5 * torch::randn({1, 2, length, d});
  const auto y_BHLD = 0.5 * torch::randn({1, 2, length, d});
  const auto v_BHLD = torch::randn({1, 2, length, d});
  auto y_huge = y_BHLD.clone();
  y_huge.narrow(2, t + 1, length - t - 1).mul_(200.0);  // |y| ~ 300 after t
  for (int64_t chunk : {4, 7, 64}) {
    auto run = [&](const torch::Tensor& y) {
      const auto q = StabilisedQueryFeatures(LogPositiveFeatures(x_BHLD, w_MD));
      const auto key = StabilisedKeyFeatures(LogPositiveFeatures(y, w_MD));
      return LinearAttention(q, key.features_BHLM, key.log_scale_BHL, v_BHLD, true, chunk);
    };
    const auto base = run(y_BHLD), changed = run(y_huge);
    ASSERT_TRUE(torch::isfinite(changed).all().item<bool>());
    const double err = (base.narrow(2, 0, t + 1) - changed.narrow(2, 0, t + 1)).abs().max().item<double>();
    std::cout << "[stabiliser] chunk=" << chunk << " max change at positions <= t after huge later keys: " << err << "\n";
    EXPECT_EQ(err, 0.0);
  }
}

}  // namespace
}  // namespace darkformer
