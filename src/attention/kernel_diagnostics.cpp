// Kernel diagnostics (see kernel_diagnostics.h).
#include "attention/kernel_diagnostics.h"

#include <ATen/CPUGeneratorImpl.h>
#include <yaml-cpp/yaml.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/softmax_estimator.h"
#include "util/config_reader.h"
#include "util/error.h"

namespace darkformer {

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

AttentionKernel Build(const std::string &name, const KernelShape &shape,
                      const std::string &options_yaml) {
  return MakeAttentionKernel(
      name, shape, ConfigReader(YAML::Load(options_yaml), "attention." + name));
}

EstimatorStats Summarise(const std::string &estimator,
                         const std::string &target, int64_t m,
                         const torch::Tensor &r_NP,
                         const torch::Tensor &kappa_P,
                         const torch::Tensor &closed_form_P) {
  EstimatorStats s;
  s.estimator = estimator;
  s.target = target;
  s.num_features = m;
  s.relative_error = (r_NP - 1).abs().mean().item<double>();
  s.relative_variance = r_NP.var(0).mean().item<double>();
  s.variance = (r_NP * kappa_P).var(0).mean().item<double>();
  s.closed_form_variance = closed_form_P.mean().item<double>();
  return s;
}

} // namespace

torch::Tensor AnisotropicCovariance(int64_t dim, double lambda_max,
                                    double lambda_ratio, uint64_t seed) {
  DF_CHECK(
      dim > 0 && lambda_max > 0 && lambda_ratio >= 1,
      "AnisotropicCovariance: need dim > 0, lambda_max > 0, ratio >= 1; got "
          << dim << ", " << lambda_max << ", " << lambda_ratio);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Haar rotation: QR of a Gaussian matrix with the signs of R's diagonal
  // folded into Q.
  auto [q, r] = torch::linalg_qr(torch::randn({dim, dim}, generator, kF64));
  const auto u_DD = q * torch::sign(r.diagonal()).unsqueeze(0);
  const auto lambda_D =
      torch::logspace(std::log10(lambda_max / lambda_ratio),
                      std::log10(lambda_max), dim, 10.0, kF64);
  return torch::matmul(u_DD * lambda_D.unsqueeze(0), u_DD.t());
}

torch::Tensor OptimalProposalCovariance(const torch::Tensor &lambda_DD) {
  auto [eigenvalues_D, eigenvectors_DD] =
      torch::linalg_eigh(lambda_DD.to(torch::kFloat64));
  const double lo = eigenvalues_D.min().item<double>(),
               hi = eigenvalues_D.max().item<double>();
  DF_CHECK(lo > -1e-12 && hi < 0.5,
           "Theorem 3.2's Sigma* = (I + 2 Lambda)(I - 2 Lambda)^-1 needs "
           "Lambda's eigenvalues in [0, 1/2); got ["
               << lo << ", " << hi << "]");
  const auto sigma_D = (1 + 2 * eigenvalues_D) / (1 - 2 * eigenvalues_D);
  return torch::matmul(eigenvectors_DD * sigma_D.unsqueeze(0),
                       eigenvectors_DD.t());
}

torch::Tensor EstimatorRatios(const torch::Tensor &x_PD,
                              const torch::Tensor &y_PD,
                              const torch::Tensor &proposal_DD,
                              int64_t num_features, int64_t draws,
                              uint64_t seed) {
  const auto x = x_PD.to(torch::kFloat64), y = y_PD.to(torch::kFloat64);
  const int64_t d = x.size(1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto z_NMD = torch::randn({draws, num_features, d}, generator, kF64);
  auto omega_NMD = z_NMD;
  torch::Tensor log_w_NM;
  if (proposal_DD.defined()) {
    // omega = L z with Sigma = L L^T, so omega^T Sigma^-1 omega = |z|^2 and
    // log w = log N(omega; 0, I) - log N(omega; 0, Sigma) = -|omega|^2/2 +
    // |z|^2/2 + log det(Sigma)/2.
    const auto l_DD = torch::linalg_cholesky(proposal_DD.to(torch::kFloat64));
    omega_NMD = torch::matmul(z_NMD, l_DD.t());
    const double half_logdet = l_DD.diagonal().log().sum().item<double>();
    log_w_NM = -0.5 * omega_NMD.pow(2).sum(-1) + 0.5 * z_NMD.pow(2).sum(-1) +
               half_logdet;
  }
  // log Z = omega.(x + y) - (|x|^2 + |y|^2)/2 (000 eq. 2 with the importance
  // factor).
  const auto c_P = 0.5 * (x.pow(2).sum(-1) + y.pow(2).sum(-1));
  auto log_z_NPM =
      torch::matmul((x + y).unsqueeze(0), omega_NMD.transpose(1, 2)) -
      c_P.view({1, -1, 1});
  if (log_w_NM.defined())
    log_z_NPM = log_z_NPM + log_w_NM.unsqueeze(1);
  const auto log_kappa_P = (x * y).sum(-1);
  return torch::exp(torch::logsumexp(log_z_NPM, -1) -
                    std::log(static_cast<double>(num_features)) - log_kappa_P);
}

torch::Tensor ClosedFormVariance(const torch::Tensor &x_PD,
                                 const torch::Tensor &y_PD,
                                 const torch::Tensor &proposal_DD,
                                 int64_t num_features) {
  const auto x = x_PD.to(torch::kFloat64), y = y_PD.to(torch::kFloat64);
  const int64_t d = x.size(1);
  const auto eye = torch::eye(d, kF64);
  const auto sigma =
      proposal_DD.defined() ? proposal_DD.to(torch::kFloat64) : eye;
  const auto a_DD = 2 * eye - torch::linalg_inv(sigma);
  const auto u_PD = x + y;
  const auto quad_P =
      (torch::matmul(u_PD, torch::linalg_inv(a_DD)) * u_PD).sum(-1);
  const double log_det_ratio =
      0.5 * (torch::logdet(sigma) - torch::logdet(a_DD)).item<double>();
  const auto second_moment_P = torch::exp(log_det_ratio + 2 * quad_P -
                                          x.pow(2).sum(-1) - y.pow(2).sum(-1));
  return (second_moment_P - torch::exp(2 * (x * y).sum(-1))) /
         static_cast<double>(num_features);
}

namespace {

EstimatorStats Compare(const std::string& label, const FittedEstimator& e, const torch::Tensor& x_PD,
                       const torch::Tensor& y_PD, int64_t m, int64_t draws, uint64_t seed) {
  return Summarise(label, e.target, m, e.ratios(x_PD, y_PD, m, draws, seed), e.target_value(x_PD, y_PD),
                   e.variance_per_feature(x_PD, y_PD) / static_cast<double>(m));
}

}  // namespace

std::vector<EstimatorStats>
CompareEstimators(const SyntheticEstimatorOptions &o,
                  const std::vector<int64_t> &num_features) {
  torch::NoGradGuard no_grad;
  const auto lambda_DD =
      AnisotropicCovariance(o.dim, o.lambda_max, o.lambda_ratio, o.seed);
  const auto sigma_star_DD = OptimalProposalCovariance(lambda_DD);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1);
  const auto l_DD = torch::linalg_cholesky(lambda_DD);
  const auto x_PD =
      torch::matmul(torch::randn({o.pairs, o.dim}, generator, kF64), l_DD.t());
  const auto y_PD =
      torch::matmul(torch::randn({o.pairs, o.dim}, generator, kF64), l_DD.t());

  // Every registered estimator, fitted to the same pairs as its kernel's Calibrate would be.
  std::vector<std::pair<std::string, FittedEstimator>> estimators;
  for (const auto &entry : RegisteredEstimators())
    estimators.emplace_back(entry.label, entry.fit(x_PD, y_PD));
  const auto kappa_P = torch::exp((x_PD * y_PD).sum(-1));
  std::vector<EstimatorStats> out;
  for (int64_t m : num_features) {
    // Distinct seeds per estimator and m: the estimators' draws are independent.
    uint64_t stream = o.seed + 1000003ull * static_cast<uint64_t>(m) + 10;
    for (const auto &[label, e] : estimators)
      out.push_back(Compare(label, e, x_PD, y_PD, m, o.draws, ++stream));
    // 000 Thm 3.2: Performer's projections drawn from the proposal Sigma* of the known Lambda,
    // importance-weighted back to N(0, I): an analysis of the paper, not a kernel.
    out.push_back(Summarise(
        "performer_is", "exp(x.y)", m,
        EstimatorRatios(x_PD, y_PD, sigma_star_DD, m, o.draws, ++stream),
        kappa_P, ClosedFormVariance(x_PD, y_PD, sigma_star_DD, m)));
  }
  return out;
}

std::vector<EstimatorStats> CompareFavorEstimatorsOnLayer(const torch::Tensor &q_BHLD, const torch::Tensor &k_BHLD,
                                                          double scale, const std::vector<int64_t> &num_features,
                                                          int64_t pairs, int64_t draws, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const int64_t batch = q_BHLD.size(0), heads = q_BHLD.size(1), length = q_BHLD.size(2), d = q_BHLD.size(3);
  DF_CHECK(k_BHLD.sizes() == q_BHLD.sizes(), "CompareFavorEstimatorsOnLayer: k " << k_BHLD.sizes() << " must match q "
                                                                                 << q_BHLD.sizes());
  const double root = std::sqrt(scale);
  const auto x_BHLD = q_BHLD.to(torch::kFloat64) * root, y_BHLD = k_BHLD.to(torch::kFloat64) * root;
  // FAVOR#'s family, each fitted to the whole layer batch as its kernel's Calibrate.
  std::vector<std::pair<std::string, FittedEstimator>> estimators;
  for (const auto &entry : RegisteredEstimators())
    if (entry.dense_exponential)
      estimators.emplace_back(entry.label, entry.fit(x_BHLD.reshape({-1, d}), y_BHLD.reshape({-1, d})));
  // Causal pairs: query position i uniform, key position j uniform in [0, i].
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto b = torch::randint(batch, {pairs}, generator, torch::kInt64);
  const auto h = torch::randint(heads, {pairs}, generator, torch::kInt64);
  const auto i = torch::randint(length, {pairs}, generator, torch::kInt64);
  const auto j = (torch::rand({pairs}, generator, torch::kFloat64) * (i + 1).to(torch::kFloat64)).floor().to(torch::kInt64);
  const auto x_PD = x_BHLD.index({b, h, i}), y_PD = y_BHLD.index({b, h, j});
  std::vector<EstimatorStats> out;
  for (int64_t m : num_features) {
    uint64_t stream = seed + 1000003ull * static_cast<uint64_t>(m);
    for (const auto &[label, e] : estimators) out.push_back(Compare(label, e, x_PD, y_PD, m, draws, ++stream));
  }
  return out;
}

CovarianceSpectrum Spectrum(const torch::Tensor &samples_ND) {
  const auto s = samples_ND.to(torch::kFloat64);
  const auto centred = s - s.mean(0, /*keepdim=*/true);
  const auto cov_DD =
      torch::matmul(centred.t(), centred) / std::max<int64_t>(1, s.size(0) - 1);
  const auto lambda_D = torch::linalg_eigvalsh(cov_DD).clamp_min(1e-12);
  const auto p_D = lambda_D / lambda_D.sum();
  CovarianceSpectrum out;
  out.condition_number = (lambda_D.max() / lambda_D.min()).item<double>();
  out.effective_rank = std::exp(-(p_D * p_D.log()).sum().item<double>());
  out.trace = lambda_D.sum().item<double>();
  return out;
}

LayerDiagnostics DiagnoseLayer(const torch::Tensor &q_BHLD,
                               const torch::Tensor &k_BHLD,
                               const torch::Tensor &v_BHLD, double scale,
                               int64_t layer,
                               const std::vector<KernelSpec> &kernels) {
  torch::NoGradGuard no_grad;
  const int64_t heads = q_BHLD.size(1), d = q_BHLD.size(3);
  DF_CHECK(k_BHLD.size(1) == heads && v_BHLD.size(1) == heads,
           "DiagnoseLayer: k " << k_BHLD.sizes() << " and v " << v_BHLD.sizes()
                               << " must have q's " << heads << " heads");
  const auto q = q_BHLD.to(torch::kFloat32), k = k_BHLD.to(torch::kFloat32),
             v = v_BHLD.to(torch::kFloat32);
  LayerDiagnostics out;
  out.layer = layer;
  const double root = std::sqrt(scale);
  out.x = Spectrum(q.reshape({-1, d}) * root);
  out.y = Spectrum(k.reshape({-1, d}) * root);

  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  shape.layer_index = layer;
  AttentionCall call; // causal softmax of s q.k: no soft-cap, no window
  call.causal = true;
  call.scale = scale;
  const auto exact =
      Build("exact", shape, "{}")->forward(q, k, v, call).to(torch::kFloat64);
  const double exact_norm = exact.norm().item<double>();
  for (const auto &spec : kernels) {
    auto kernel = Build(spec.name, shape, spec.options_yaml);
    if (spec.calibrate) DF_CHECK(kernel->wants_calibration(), "kernel '" << spec.label << "' takes no calibration");
    // Data-aware kernels (darkformer whitening, gerf's optimal A, saderf) calibrate on the layer.
    if (kernel->wants_calibration()) kernel->Calibrate(q, k, scale);
    const auto result = kernel->forward(q, k, v, call).to(torch::kFloat64);
    out.errors.push_back(
        {spec.label, (result - exact).norm().item<double>() / exact_norm});
  }
  return out;
}

} // namespace darkformer
