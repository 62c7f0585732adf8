// The fused operator's CPU exponentials (fast_exp2.h) against exact 2^x (std::exp2 in double)
// and against the LibTorch ops they replace.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/ops/fast_exp2.h"
#include "rounding_bounds.h"

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
// The fused passes of the raw kernel's sub-chunk pairs against exp2 of the sum, one pass at a time
// (n = 37: four vectors and a tail).
TEST_P(FastExp2Test, FusedPassesEqualExp2OfTheSum) {
  torch::manual_seed(3);
  const int64_t n = 37;
  const auto a = torch::randn({n}) * 20, b = torch::randn({n}) * 20;
  const float shift = (a + b).max().item<float>();
  auto expected = ((a + b) - shift).contiguous();
  Exp2InPlace(expected.data_ptr<float>(), n);
  const auto e64 = expected.to(torch::kFloat64);
  const double sum = e64.sum().item<double>();
  // The same exp2 of the same rounded argument: only the summation order differs, within
  // gamma_n of the sum of the (positive) terms (rounding_bounds.h).
  const double tolerance = 2 * testing::Gamma(n) * e64.sum().item<double>();
  EXPECT_NEAR(SumExp2OfSum(a.data_ptr<float>(), b.data_ptr<float>(), shift, n), sum, tolerance);
  auto out = torch::empty({n});
  Exp2OfSum(a.data_ptr<float>(), b.data_ptr<float>(), shift, out.data_ptr<float>(), n);
  EXPECT_TRUE(torch::equal(out, expected));
  auto da = torch::ones({n}), db = torch::zeros({n});
  const float total = AccumulateExp2OfSum(a.data_ptr<float>(), b.data_ptr<float>(), shift, 0.5f, da.data_ptr<float>(),
                                          db.data_ptr<float>(), n);
  EXPECT_NEAR(total, sum, tolerance);
  // A fused multiply-add against a product and a sum: one rounding apart, u of a value <= 1.5.
  EXPECT_TRUE(torch::allclose(da, 1 + 0.5 * expected, 0, 1.5 * testing::kFp32Unit));
  EXPECT_TRUE(torch::allclose(db, 0.5 * expected, 0, 1.5 * testing::kFp32Unit));
}

}  // namespace
}  // namespace darkformer
