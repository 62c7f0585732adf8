// SLAY attention (see slay_kernel.h).
#include "attention/slay_kernel.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"

namespace darkformer {

std::pair<torch::Tensor, torch::Tensor> GaussLaguerre(int64_t n) {
  DF_CHECK(n > 0, "GaussLaguerre: n must be positive, got " << n);
  // Jacobi matrix of the Laguerre polynomials: diagonal 2i + 1, off-diagonal i (i = 1..n-1).
  auto jacobi = torch::diag(2 * torch::arange(n, torch::kFloat64) + 1);
  if (n > 1) {
    const auto off = torch::arange(1, n, torch::kFloat64);
    jacobi = jacobi + torch::diag(off, 1) + torch::diag(off, -1);
  }
  auto [nodes, vectors] = torch::linalg_eigh(jacobi);
  return {nodes, vectors.select(0, 0).pow(2)};  // weights: mu_0 = int e^-u = 1 times v_0^2
}

torch::Tensor YatKernel(const torch::Tensor& t, double epsilon) {
  const auto x = t.to(torch::kFloat64);
  return x.pow(2) / (2 + epsilon - 2 * x);
}

torch::Tensor YatQuadrature(const torch::Tensor& t, double epsilon, int64_t nodes) {
  const auto [u, a] = GaussLaguerre(nodes);
  const double c = 2 + epsilon;
  const auto x = t.to(torch::kFloat64).unsqueeze(-1);
  return (x.pow(2) * (a / c) * (2 * u / c * x).exp()).sum(-1);
}

SlayKernelImpl::Options SlayKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{SignedOptions::Read(reader, /*with_redraw=*/true, kDefaultSlayFeatures)};
  o.nodes = reader.Get<int64_t>("nodes", o.nodes, KeySpec("Gauss-Laguerre nodes n").Above(0));
  o.epsilon = reader.Get<double>("epsilon", o.epsilon, KeySpec("C = 2 + epsilon, so K <= 1/epsilon").Above(0, "003 Lemma 1"));
  o.sketch_dim = reader.Get<int64_t>("sketch_dim", o.sketch_dim,
                                     KeySpec("P: the product sketch of q^ (x) q^").Min(0, "0 = the exact d^2 coordinates"));
  reader.RejectUnknown();
  return o;
}

SlayKernelImpl::SlayKernelImpl(const KernelShape& shape, const Options& options)
    : SignedFeatureKernel(shape, options), epsilon_(options.epsilon), nodes_(options.nodes), sketch_dim_(options.sketch_dim) {
  RegisterDraw(shape.head_dim);
  if (sketch_dim_ > 0) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(DrawSeed(KernelSeed(options_.seed, shape), 0) + 7);
    sketch_ = register_buffer("sketch", at::normal(0.0, 1.0, {2, sketch_dim_, shape.head_dim}, generator, torch::kFloat32));
  }
}

torch::Tensor SlayKernelImpl::Features(const torch::Tensor& x_BNLD) const {
  const auto x = x_BNLD.to(FeatureDtype(x_BNLD.scalar_type()));
  const auto unit = x / x.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12);
  // t^2 part: exact outer product, or the product sketch (S1 x) * (S2 x) / sqrt(p).
  torch::Tensor poly_BNLP;
  if (sketch_dim_ > 0) {
    const auto s = sketch_.to(x.device(), x.scalar_type());
    poly_BNLP = Fp32Matmul(unit, s[0].t()) * Fp32Matmul(unit, s[1].t()) / std::sqrt(double(sketch_dim_));
  } else {
    poly_BNLP = (unit.unsqueeze(-1) * unit.unsqueeze(-2)).flatten(-2);
  }
  const auto [u, a] = GaussLaguerre(nodes_);
  const double c = 2 + epsilon_, m = static_cast<double>(projection_.size(0));
  const auto proj_BNLM = Fp32Matmul(unit, projection_.to(x.device(), x.scalar_type()).t());
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < nodes_; ++i) {
    const double beta = 2 * u[i].item<double>() / c, weight = std::sqrt(a[i].item<double>() / c);
    // Positive random features of exp(beta t) on the unit sphere: |sqrt(beta) x^|^2 / 2 = beta / 2.
    const auto exp_BNLM = (std::sqrt(beta) * proj_BNLM - 0.5 * beta).exp() / std::sqrt(m);
    parts.push_back((weight * poly_BNLP.unsqueeze(-1) * exp_BNLM.unsqueeze(-2)).flatten(-2));
  }
  return torch::cat(parts, -1);
}

torch::Tensor SlayKernelImpl::EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const {
  const auto t_BHP = (x_BHPD / x_BHPD.norm(2, -1, true) * (y_BHPD / y_BHPD.norm(2, -1, true))).sum(-1);
  return YatQuadrature(t_BHP, epsilon_, nodes_);
}

double SlayKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const {
  return Features(x_BHLD.to(torch::kFloat32)).abs().max().log().item<double>();
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<SlayKernel>(
    "slay", 90, "SLAY (003): spherical Yat kernel t^2/(C - 2t) of unit-norm q, k by Gauss-Laguerre quadrature");
}  // namespace

}  // namespace darkformer
