// The fused operator's CPU exponentials (fast_exp2.h) against exact 2^x (std::exp2 in double)
// and against the LibTorch ops they replace.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/ops/fast_exp2.h"

namespace darkformer {
namespace {

// Every test runs both paths: eight lanes (where the CPU has AVX2) and one value at a time.
class FastExp2Test : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ForceScalarExp2ForTesting(GetParam());
    if (GetParam()) EXPECT_FALSE(Exp2LoopsVectorised());  // the operator then keeps LibTorch's ops
  }
  void TearDown() override { ForceScalarExp2ForTesting(false); }
};
INSTANTIATE_TEST_SUITE_P(Paths, FastExp2Test, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Scalar" : "Vector"; });

TEST_P(FastExp2Test, RelativeErrorBelowTwoFp32UlpsOverTheWholeRange) {
  std::vector<float> x;
  for (double v = -126.0; v <= 126.0; v += 0.0007) x.push_back(static_cast<float>(v));
  for (const float v : {0.0f, -0.5f, 0.5f, -1e-8f, 1e-8f, -125.9999f}) x.push_back(v);
  std::vector<float> y = x;
  Exp2InPlace(y.data(), static_cast<int64_t>(y.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double exact = std::exp2(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - exact) / exact);
  }
  std::cout << "[fast exp2] worst relative error " << worst << " over " << x.size() << " points\n";
  EXPECT_LE(worst, 2.5e-7);  // fp32's unit roundoff is 6e-8, one ulp up to 1.2e-7
}

TEST_P(FastExp2Test, UnderflowIsZeroAndNaNStaysNaN) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Sixteen values (two full vectors) and one more (the tail).
  std::vector<float> x;
  for (int i = 0; i < 17; ++i) x.push_back(i % 4 == 0 ? -126.5f : i % 4 == 1 ? -1000.0f : i % 4 == 2 ? -inf : nan);
  Exp2InPlace(x.data(), static_cast<int64_t>(x.size()));
  for (int i = 0; i < 17; ++i) {
    if (i % 4 == 3) {
      EXPECT_TRUE(std::isnan(x[i])) << i;
    } else {
      EXPECT_EQ(x[i], 0.0f) << i;
    }
  }
}

// Rows whose length is and is not a multiple of the vector width.
TEST_P(FastExp2Test, ShiftExp2RowsEqualsAmaxSubExp2) {
  for (const int64_t cols : {1, 13, 256}) {
    torch::manual_seed(cols);
    const auto x = torch::randn({7, cols}) * 20;
    auto fast = x.clone();
    auto max = torch::empty({7});
    ShiftExp2Rows(fast.data_ptr<float>(), 7, cols, max.data_ptr<float>());
    const auto ref_max = x.amax(-1);
    // The difference rounds in fp32 as LibTorch's sub_ does; the exponential is exact.
    const auto ref = torch::exp2((x - ref_max.unsqueeze(-1)).to(torch::kFloat64));
    EXPECT_TRUE(torch::equal(max, ref_max)) << cols;
    // Above 2^-126 within 2.5e-7 relative; below it (fp32 denormals) exactly 0, as documented.
    const auto normal = ref >= std::exp2(-126.0);
    const auto rel = (fast.to(torch::kFloat64) - ref).abs() / ref.clamp_min(1e-300);
    EXPECT_LE(rel.masked_select(normal).max().item<double>(), 2.5e-7) << cols;
    EXPECT_TRUE(fast.masked_select(normal.logical_not()).eq(0).all().item<bool>()) << cols;
    EXPECT_EQ(fast.amax(-1).min().item<float>(), 1.0f) << cols;  // each row's max maps to 2^0
  }
}

TEST_P(FastExp2Test, CausalWeightsEqualTheMaskedProductAndZeroLaterKeys) {
  const int64_t rows = 3, group = 2, c = 11, length = 20;
  torch::manual_seed(4);
  const auto b = torch::randn({rows, c}) * 5;
  // ref_i >= b_j for j <= i: a prefix max plus a carried reference, taken from a wider buffer.
  const auto wide = torch::zeros({rows, length});
  wide.narrow(1, 3, c).copy_(std::get<0>(b.cummax(-1)) + 0.5);
  const auto ref = wide.narrow(1, 3, c);
  const auto a = torch::randn({rows, group, c, c}), p = torch::randn({rows, group, c, c});
  auto fast_a = a.clone(), fast_p = p.clone();
  fast_a[1][1][2][7] = std::numeric_limits<float>::quiet_NaN();  // a later key (j = 7 > i = 2)
  float* blocks[] = {fast_a.data_ptr<float>(), fast_p.data_ptr<float>()};
  MulCausalWeights(blocks, 2, rows, group, c, b.data_ptr<float>(), b.stride(0), ref.data_ptr<float>(), ref.stride(0));
  const auto mask = torch::ones({c, c}).tril().to(torch::kBool);
  const auto w = torch::exp2(b.to(torch::kFloat64).unsqueeze(1) - ref.to(torch::kFloat64).unsqueeze(2))
                     .masked_fill(mask.logical_not(), 0.0)
                     .unsqueeze(1);
  for (const auto& [fast, orig] : {std::pair{fast_a, a}, std::pair{fast_p, p}}) {
    const auto expected = orig.to(torch::kFloat64) * w;
    EXPECT_LE((fast.to(torch::kFloat64) - expected).abs().max().item<double>(),
              2.5e-7 * orig.abs().max().item<double>());
    EXPECT_TRUE(torch::isfinite(fast).all().item<bool>());
  }
}

}  // namespace
}  // namespace darkformer
