// The signed kernels (trig, slay, flexformer) keep their signed-safe normaliser: its magnitude is
// floored at `normaliser_floor` with its sign kept, since a signed estimate of the normaliser can
// cross zero whatever the shift (issue 38, part 2). At |x| = |y| from 1 to 100 (x = q / d^(1/4))
// their fp32 outputs and gradients stay finite, and the fp32 output is within a rounding bound of
// the same estimator in fp64 (issue 50), derived below from the fp64 run's own terms. The bound
// replaces fixed tolerances (1e-5 at |x| = 1, 1e-4 for slay) that held on some BLAS paths only.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "attention/kernel_registry.h"
#include "attention/signed_feature_kernel.h"
#include "rounding_bounds.h"

namespace darkformer {
namespace {

using testing::Gamma;
using testing::kFp32Unit;

constexpr int64_t kHeads = 2, kLength = 40, kDim = 8, kChunk = 16;

AttentionKernel Make(const std::string& name) {
  KernelShape shape;
  shape.num_heads = kHeads;
  shape.head_dim = kDim;
  const std::string chunk = "chunk_size: " + std::to_string(kChunk);
  const std::string yaml = name == "slay" ? "{" + chunk + "}" : "{num_features: 16, " + chunk + "}";
  return MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
}

SignedFeatureKernel& Signed(AttentionKernel& kernel) { return dynamic_cast<SignedFeatureKernel&>(*kernel.ptr()); }

struct Run {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};

Run Forward(AttentionKernel& kernel, const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0,
            torch::ScalarType dtype, const AttentionCall& call) {
  auto q = q0.to(dtype).requires_grad_(), k = k0.to(dtype).requires_grad_(), v = v0.to(dtype).requires_grad_();
  const auto out = kernel->forward(q, k, v, call);
  out.sum().backward();
  return {out.detach(), {q.grad(), k.grad(), v.grad()}};
}

bool Finite(const Run& r) {
  bool ok = torch::isfinite(r.out).all().item<bool>();
  for (const auto& g : r.grads) ok = ok && g.defined() && torch::isfinite(g).all().item<bool>();
  return ok;
}

// The bound on |out32 - out64| per row t and value coordinate, from the fp64 run's terms. With f
// the signed features and c the key log-scale (none for slay), the composite path computes
//   w_tj = e^(c_j - r_t) f(x_t).f(y_j) for j <= t (r_t = max_{j <= t} c_j),  out_t = sum_j w_tj v_j / sum_j w_tj.
// Each term f_i(x_t) f_i(y_j) e^(c_j - r_t) v_j of the numerator (and without v of the normaliser):
// - enters with the features' own fp32 error, taken as it is (the fp32 and fp64 features of these
//   inputs differ by df): |f~x f~y - fx fy| <= |dfx||fy| + |fx||dfy| + |dfx||dfy|;
// - is summed over the m features and the j <= t positions (through chunk states or the masked
//   chunk product; at most m + L additions) after 3 products: gamma_(m + L + 3);
// - carries its scale through at most N + 2 exps and products (N chunks: the state is rescaled once
//   per chunk), each argument a rounded difference, and the arguments add up to r_t - c_j:
//   testing::ScaleChainError(N + 2, r_t - c_j), and the log-scale's own error dc moves it by e^(2 max|dc|) - 1
//   (r_t's share is common to the row and cancels);
// - v is rounded to fp32 once: u.
// Summed with absolute values these bound the numerator's and normaliser's errors, and
// testing::RatioBound the output's. The fp64 run's own error (2^-53 in place of 2^-24) is
// negligible against it. Rows whose normaliser may meet the floor are not bounded (the floor
// then replaces the estimator in one run and perhaps not the other).
struct Bound {
  torch::Tensor bound_BHLD;  // +inf where the row is not bounded
  int64_t rows = 0, bounded_rows = 0;
};

Bound RoundingBound(const std::string& name, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const AttentionCall& call) {
  torch::NoGradGuard no_grad;
  auto k32 = Make(name), k64 = Make(name);  // the same seed: the same draws
  k64->to(torch::kFloat64);
  auto& s32 = Signed(k32);
  auto& s64 = Signed(k64);
  const auto f64 = torch::kFloat64;
  auto features = [&](const torch::Tensor& t, bool fp32) {
    auto& kernel = fp32 ? s32 : s64;
    return kernel.SignedFeatures(kernel.Inputs(t, fp32 ? torch::kFloat32 : f64, call)).to(f64);
  };
  const auto fx = features(q, false), fy = features(k, false);
  const auto dfx = (features(q, true) - fx).abs(), dfy = (features(k, true) - fy).abs();
  const auto y64 = s64.Inputs(k, f64, call);
  const auto c = s64.LogScale(y64);
  double dc = 0;
  torch::Tensor scale_BHLL = torch::ones({1, kHeads, kLength, kLength}, f64).tril();  // [t][j]
  torch::Tensor gap_BHLL = torch::zeros_like(scale_BHLL);                             // r_t - c_j
  if (c.defined()) {
    dc = (s32.LogScale(s32.Inputs(k, torch::kFloat32, call)).to(f64) - c).abs().max().item<double>();
    const auto r = std::get<0>(c.cummax(-1));
    gap_BHLL = (r.unsqueeze(-1) - c.unsqueeze(-2)).tril();
    scale_BHLL = (-gap_BHLL).exp().tril();
  }
  const auto mag = torch::matmul(fx.abs(), fy.abs().transpose(-1, -2)) * scale_BHLL;  // sum_i |fx fy| e^(c - r)
  const auto feature_error = (torch::matmul(dfx, fy.abs().transpose(-1, -2)) +
                              torch::matmul(fx.abs(), dfy.transpose(-1, -2)) + torch::matmul(dfx, dfy.transpose(-1, -2))) *
                             scale_BHLL;
  const int64_t m = fx.size(-1), chunks = (kLength + kChunk - 1) / kChunk;
  const auto delta = gap_BHLL * kFp32Unit + testing::ScaleChainError(chunks + 2, 0) + std::expm1(2 * dc) +
                     Gamma(m + kLength + 3);
  const auto term_error = delta * mag + (1 + delta) * feature_error;  // B H L L, 0 above the diagonal
  const auto v64 = v.to(f64).abs();
  const auto num_error = torch::matmul(term_error + kFp32Unit * mag, v64);  // B H L D
  const auto den_error = term_error.sum(-1);                                 // B H L
  const auto w = torch::matmul(fx, fy.transpose(-1, -2)) * scale_BHLL;
  const auto den = w.sum(-1);
  const auto out = torch::matmul(w, v.to(f64)) / den.unsqueeze(-1);
  Bound b;
  b.bound_BHLD = torch::full_like(out, std::numeric_limits<double>::infinity());
  const double floor = s32.normaliser_floor();
  auto bound = b.bound_BHLD.accessor<double, 4>();
  const auto out_a = out.accessor<double, 4>(), num_a = num_error.accessor<double, 4>();
  const auto den_a = den.accessor<double, 3>(), den_error_a = den_error.accessor<double, 3>();
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t t = 0; t < kLength; ++t) {
      ++b.rows;
      if (std::abs(den_a[0][h][t]) - den_error_a[0][h][t] <= floor) continue;
      ++b.bounded_rows;
      for (int64_t d = 0; d < kDim; ++d) {
        bound[0][h][t][d] = testing::RatioBound(num_a[0][h][t][d], den_error_a[0][h][t], out_a[0][h][t][d], den_a[0][h][t]);
      }
    }
  }
  return b;
}

TEST(SignedScaleTest, FiniteAtEveryScaleAndWithinTheRoundingBound) {
  for (const std::string name : {"trig", "slay", "flexformer"}) {
    for (const double norm : {1.0, 3.0, 10.0, 30.0, 100.0}) {
      torch::manual_seed(static_cast<uint64_t>(norm * 10));
      const double s = norm * std::pow(static_cast<double>(kDim), 0.25);
      auto unit = [](const torch::Tensor& t) { return t / t.norm(2, -1, true); };
      const auto q = s * unit(torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64));
      const auto k = s * unit(torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64));
      const auto v = torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64);
      AttentionCall call;
      call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
      auto kernel = Make(name);
      const auto fp32 = Forward(kernel, q, k, v, torch::kFloat32, call);
      kernel->to(torch::kFloat64);
      const auto fp64 = Forward(kernel, q, k, v, torch::kFloat64, call);
      const std::string where = name + " |x|=" + std::to_string(int(norm));
      // The floored signed normaliser keeps outputs and gradients finite at every scale.
      ASSERT_TRUE(Finite(fp32)) << where;
      ASSERT_TRUE(Finite(fp64)) << where;
      const auto b = RoundingBound(name, q, k, v, call);
      const auto error = (fp32.out.to(torch::kFloat64) - fp64.out).abs();
      const auto bounded = torch::isfinite(b.bound_BHLD);
      const double worst = (error / b.bound_BHLD).masked_select(bounded).max().item<double>();
      const double relative = (error.max() / fp64.out.abs().max()).item<double>();
      std::cout << "[signed scale] " << where << ": fp32-vs-fp64 output error " << relative << " of max|out|, "
                << worst << " of the rounding bound (" << b.bounded_rows << "/" << b.rows << " rows bounded)\n";
      EXPECT_LE(worst, 1.0) << where;
      // At |x| = 1 every row's normaliser is clear of the floor: every row is bounded.
      if (norm <= 1) EXPECT_EQ(b.bounded_rows, b.rows) << where;
    }
  }
}

}  // namespace
}  // namespace darkformer
