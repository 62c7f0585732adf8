// Fp32Matmul (ops/fp32_products.h): the products that feed the features' exponents keep fp32's
// accuracy where CUDA takes TF32 operands. The CPU has no TF32, so the tensor core is emulated here:
// each operand of a product rounded to TF32 (to nearest, or truncated: the worse of what hardware
// does), the products then exact and summed in fp64. Held to the bound the header derives, each
// term within 2^-19.6 of |a_k b_k| with the split, where one TF32 product may miss by 2^-11 and more.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/ops/fp32_products.h"
#include "rounding_bounds.h"

namespace darkformer {
namespace {

// Magnitudes from 2^-40 to 2^40, both signs, zeros among them; with `subnormals`, two of those too.
torch::Tensor WideRange(int64_t rows, int64_t cols, uint64_t seed, bool subnormals = false) {
  torch::manual_seed(seed);
  auto x = torch::randn({rows, cols}) * torch::exp2(torch::randint(-40, 41, {rows, cols}).to(torch::kFloat32));
  x.view(-1)[0] = 0.0f;
  x.view(-1)[1] = -0.0f;
  if (subnormals) {
    x.view(-1)[2] = 1e-40f;
    x.view(-1)[3] = -3e-39f;
  }
  return x;
}

// A tensor core's view of an fp32 operand: its 13 low mantissa bits rounded away (to nearest,
// half away from zero) or dropped (truncated); in fp64 for the exact products that follow.
torch::Tensor Tf32(const torch::Tensor& x, bool truncate) {
  const auto bits = x.contiguous().view(torch::kInt32);
  const auto kept = (truncate ? bits.clone() : bits.add(1 << 12)).bitwise_and_(~((1 << 13) - 1));
  return kept.view(torch::kFloat32).to(torch::kFloat64);
}

TEST(Fp32ProductsTest, SplitKeepsTf32BitsAndIsExact) {
  const auto x = WideRange(64, 96, 1, /*subnormals=*/true);
  const auto [hi, lo] = SplitForTf32(x);
  // hi: TF32's bits only; hi + lo: x itself, exactly; lo: at most half of hi's last bit, which
  // for a normal x is 2^-11 |x| (a subnormal's bits are fewer: lo below 2^-137 there).
  EXPECT_EQ(hi.view(torch::kInt32).bitwise_and(0x1FFF).count_nonzero().item<int64_t>(), 0);
  EXPECT_TRUE((hi + lo == x).all().item<bool>());  // values: -0 splits into -0 + 0
  const auto x64 = x.to(torch::kFloat64);
  const auto normal = x64.abs() >= std::ldexp(1.0, -126);
  EXPECT_TRUE((lo.to(torch::kFloat64).abs() <= std::ldexp(1.0, -11) * x64.abs()).logical_or(normal.logical_not()).all().item<bool>());
  EXPECT_TRUE((lo.to(torch::kFloat64).abs() <= std::ldexp(1.0, -137)).logical_or(normal).all().item<bool>());
  EXPECT_TRUE(torch::equal(hi.to(torch::kFloat64) + lo.to(torch::kFloat64), x64));
}

// The three products of SplitMatmul, each on an emulated tensor core, against the fp64 product:
// |error_ij| <= 2^-19.6 sum_k |a_ik| |b_kj| (the header's terms: two lo roundings of 2^-21 each, the
// dropped lo lo of 2^-22), plus fp64's own sums (n 2^-53 of the same, far below). One TF32 product
// of the same operands misses by more than 2^-14 of that somewhere: the reason for the split.
TEST(Fp32ProductsTest, ThreeTf32ProductsHoldTheDerivedBound) {
  const auto a = WideRange(48, 80, 2) * 1e-3, b = WideRange(80, 40, 3) * 1e-3;
  const auto magnitude = torch::matmul(a.to(torch::kFloat64).abs(), b.to(torch::kFloat64).abs());
  const auto exact = torch::matmul(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const auto [a_hi, a_lo] = SplitForTf32(a);
  const auto [b_hi, b_lo] = SplitForTf32(b);
  const double bound = std::pow(2.0, -19.6) + 80 * std::ldexp(1.0, -53) * 4;
  for (const bool truncate : {false, true}) {
    const auto split = torch::matmul(Tf32(a_hi, truncate), Tf32(b_lo, truncate)) +
                       torch::matmul(Tf32(a_lo, truncate), Tf32(b_hi, truncate)) +
                       torch::matmul(Tf32(a_hi, truncate), Tf32(b_hi, truncate));
    EXPECT_TRUE(((split - exact).abs() <= bound * magnitude).all().item<bool>())
        << (truncate ? "truncated" : "rounded") << " worst "
        << ((split - exact).abs() / magnitude.clamp_min(1e-300)).max().item<double>();
    const auto one = torch::matmul(Tf32(a, truncate), Tf32(b, truncate));
    EXPECT_GT(((one - exact).abs() / magnitude.clamp_min(1e-300)).max().item<double>(), std::ldexp(1.0, -14));
  }
}

// Where nothing takes TF32 (the CPU, fp64) Fp32Matmul is the plain product, to the bit; the split
// computed in fp32 (exact products) is within fp32's GEMM bound of the fp64 product: three sums of
// n terms (gamma_n each), two adds of the results, the dropped lo lo (2^-22).
TEST(Fp32ProductsTest, PlainWhereNoTf32AndTheSplitIsFp32Accurate) {
  const auto a = torch::randn({3, 16, 32}), b = torch::randn({32, 24});
  EXPECT_FALSE(SplitsForTf32(a, b));
  EXPECT_FALSE(SplitsForTf32(a.to(torch::kFloat64), b.to(torch::kFloat64)));
  EXPECT_TRUE(torch::equal(Fp32Matmul(a, b), torch::matmul(a, b)));
  const auto magnitude = torch::matmul(a.to(torch::kFloat64).abs(), b.to(torch::kFloat64).abs());
  const auto exact = torch::matmul(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const double bound = 3 * testing::Gamma(32) + testing::Gamma(2) + std::ldexp(1.0, -22);
  EXPECT_TRUE(((SplitMatmul(a, b).to(torch::kFloat64) - exact).abs() <= bound * magnitude).all().item<bool>());
}

// Under autograd the gradients flow through lo (hi is a constant of the values): d/da = g hi_b^T,
// d/db = hi_a^T g, within 2^-11 sum |g| |b| (resp. |a| |g|) of the exact ones, plus fp32's sums.
TEST(Fp32ProductsTest, GradientsThroughTheSplitAreTf32Close) {
  const auto a = torch::randn({20, 30}).requires_grad_(), b = torch::randn({30, 10}).requires_grad_();
  const auto g = torch::randn({20, 10});
  SplitMatmul(a, b).backward(g);
  const auto g64 = g.to(torch::kFloat64), a64 = a.detach().to(torch::kFloat64), b64 = b.detach().to(torch::kFloat64);
  const double tol = std::ldexp(1.0, -11) + 2 * testing::Gamma(30);
  const auto da = torch::matmul(g64, b64.t()), db = torch::matmul(a64.t(), g64);
  EXPECT_TRUE(((a.grad().to(torch::kFloat64) - da).abs() <= tol * torch::matmul(g64.abs(), b64.abs().t())).all().item<bool>());
  EXPECT_TRUE(((b.grad().to(torch::kFloat64) - db).abs() <= tol * torch::matmul(a64.abs().t(), g64.abs())).all().item<bool>());
}

// The autograd node Fp32Matmul takes on CUDA: its gradients, batch dimensions broadcast either way
// and summed back, against fp64 autograd within fp32's bound (a sum of n terms: gamma_n, the
// broadcast batch's sum on top). On a CPU its products are plain; on a GPU under TF32 they split.
TEST(Fp32ProductsTest, TrackedProductsGradientsAreTheProducts) {
  struct Case {
    std::vector<int64_t> a, b;
  };
  for (const auto& c : {Case{{2, 3, 5, 7}, {7, 4}}, Case{{5, 7}, {2, 3, 7, 4}}, Case{{2, 1, 5, 7}, {1, 3, 7, 4}}}) {
    torch::manual_seed(9);
    const auto a = torch::randn(c.a).requires_grad_(), b = torch::randn(c.b).requires_grad_();
    const auto out = TrackedFp32Matmul(a, b);
    const auto g = torch::randn(out.sizes());
    out.backward(g);
    const auto a64 = a.detach().to(torch::kFloat64).requires_grad_(), b64 = b.detach().to(torch::kFloat64).requires_grad_();
    const auto want = torch::matmul(a64, b64);
    want.backward(g.to(torch::kFloat64));
    const auto magnitude = torch::matmul(a64.detach().abs(), b64.detach().abs());
    EXPECT_TRUE(((out.to(torch::kFloat64) - want.detach()).abs() <= testing::Gamma(7) * magnitude).all().item<bool>());
    // Each gradient element sums at most 7 * 6 products (depth times the broadcast batch).
    const double tol = testing::Gamma(7 * 6);
    const auto g64 = g.to(torch::kFloat64).abs();
    const auto da_scale = at::sum_to(torch::matmul(g64, b64.detach().abs().transpose(-1, -2)), a.sizes());
    const auto db_scale = at::sum_to(torch::matmul(a64.detach().abs().transpose(-1, -2), g64), b.sizes());
    EXPECT_TRUE(((a.grad().to(torch::kFloat64) - a64.grad()).abs() <= tol * da_scale).all().item<bool>());
    EXPECT_TRUE(((b.grad().to(torch::kFloat64) - b64.grad()).abs() <= tol * db_scale).all().item<bool>());
  }
}

// NoTf32Scope: TF32 off inside, the setting before back after, whichever it was.
TEST(Fp32ProductsTest, NoTf32ScopeRestoresTheSettingBefore) {
  auto& context = at::globalContext();
  for (const bool before : {true, false}) {
    context.setAllowTF32CuBLAS(before);
    context.setAllowTF32CuDNN(before);
    {
      const NoTf32Scope scope;
      EXPECT_FALSE(context.allowTF32CuBLAS());
      EXPECT_FALSE(context.allowTF32CuDNN());
    }
    EXPECT_EQ(context.allowTF32CuBLAS(), before);
    EXPECT_EQ(context.allowTF32CuDNN(), before);
  }
  context.setAllowTF32CuBLAS(false);
  context.setAllowTF32CuDNN(false);
}

}  // namespace
}  // namespace darkformer
