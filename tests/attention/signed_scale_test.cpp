// The signed kernels (trig, slay, flexformer) keep their signed-safe normaliser: its magnitude is
// floored at `normaliser_floor` with its sign kept, since a signed estimate of the normaliser can
// cross zero whatever the shift (issue 38, part 2). This measures where they stay finite and how
// far fp32 is from the same estimator in fp64, at |x| = |y| from 1 to 100 (x = q / d^(1/4)), and
// asserts what docs/kernels.md states from these figures ("The signed kernels at scale").
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "attention/kernel_registry.h"

namespace darkformer {
namespace {

constexpr int64_t kHeads = 2, kLength = 40, kDim = 8;

AttentionKernel Make(const std::string& name) {
  KernelShape shape;
  shape.num_heads = kHeads;
  shape.head_dim = kDim;
  const std::string yaml = name == "slay" ? "{chunk_size: 16}" : "{num_features: 16, chunk_size: 16}";
  return MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
}

struct Run {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;
};

Run Forward(AttentionKernel& kernel, const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0,
            torch::ScalarType dtype) {
  auto q = q0.to(dtype).requires_grad_(), k = k0.to(dtype).requires_grad_(), v = v0.to(dtype).requires_grad_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const auto out = kernel->forward(q, k, v, call);
  out.sum().backward();
  return {out.detach(), {q.grad(), k.grad(), v.grad()}};
}

bool Finite(const Run& r) {
  bool ok = torch::isfinite(r.out).all().item<bool>();
  for (const auto& g : r.grads) ok = ok && g.defined() && torch::isfinite(g).all().item<bool>();
  return ok;
}

double Rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

// Figures per kernel and |x|: finite in fp32 (output and q, k, v gradients), and the fp32 output's
// relative distance from the fp64 run of the same draw.
struct Figure {
  bool finite;
  double output_error;
};
Figure Measure(const std::string& name, double norm) {
  torch::manual_seed(static_cast<uint64_t>(norm * 10));
  const double s = norm * std::pow(static_cast<double>(kDim), 0.25);
  auto unit = [](const torch::Tensor& t) { return t / t.norm(2, -1, true); };
  const auto q = s * unit(torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64));
  const auto k = s * unit(torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64));
  const auto v = torch::randn({1, kHeads, kLength, kDim}, torch::kFloat64);
  auto kernel = Make(name);
  const auto fp32 = Forward(kernel, q, k, v, torch::kFloat32);
  kernel->to(torch::kFloat64);
  const auto fp64 = Forward(kernel, q, k, v, torch::kFloat64);
  return {Finite(fp32), Finite(fp64) ? Rel(fp32.out, fp64.out) : std::nan("")};
}

TEST(SignedScaleTest, FiniteAtEveryScaleAndTheFp32ErrorMeasured) {
  for (const std::string name : {"trig", "slay", "flexformer"}) {
    for (const double norm : {1.0, 3.0, 10.0, 30.0, 100.0}) {
      const auto f = Measure(name, norm);
      std::cout << "[signed scale] " << name << " |x|=" << norm << " finite=" << f.finite
                << " fp32-vs-fp64 output error=" << f.output_error << "\n";
      // The floored signed normaliser keeps outputs and gradients finite at every scale.
      EXPECT_TRUE(f.finite) << name << " |x|=" << norm;
      // slay is a kernel of directions (it ignores |x|): fp32 stays close at any scale. trig and
      // flexformer carry cos(w.x) of arguments ~|w||x|, whose fp32 rounding grows with |x| (the
      // figures in docs/kernels.md); they are finite, not accurate, at large |x|.
      if (name == "slay") EXPECT_LE(f.output_error, 1e-4) << "|x|=" << norm;
      if (norm <= 1) EXPECT_LE(f.output_error, 1e-5) << name;
    }
  }
}

}  // namespace
}  // namespace darkformer
