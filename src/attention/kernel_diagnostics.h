// Kernel diagnostics for `darkformer kernel-check`: (a) the
// positive-random-feature estimator on synthetic anisotropic Gaussian inputs,
// plain (w ~ N(0, I)) vs importance-sampled from the optimal proposal N(0,
// Sigma*) (000 Lemma 3.1, Theorem 3.2) vs DARKFormer at M = I and at whitening
// M = Lambda^-1/2 (000 sec. 4.1, Appendix C); (b) per-layer anisotropy of x =
// sqrt(s) q, y = sqrt(s) k and each kernel's attention-output error against
// exact causal softmax.
//
// Shape legend: N independent draws, P (x, y) pairs, M random features, D dim,
// B batch, H heads, L positions.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "attention/attention_kernel.h"

namespace darkformer {

// ---- (a) synthetic estimator comparison
// ---------------------------------------------------------

struct SyntheticEstimatorOptions {
  int64_t dim = 16; // d
  double lambda_max =
      0.4; // largest eigenvalue of Lambda; Theorem 3.2 needs all < 1/2
  double lambda_ratio =
      100.0; // lambda_max / lambda_min, eigenvalues log-spaced (1 = isotropic)
  int64_t pairs = 256; // P pairs (x, y), x and y independent ~ N(0, Lambda)
  int64_t draws = 200; // N independent draws of the m projections per estimator
  uint64_t seed = 0;   // seeds Lambda's rotation, the pairs and every draw
};

// One estimator at one m, averaged over the P pairs. With r = kappa_hat / kappa
// per pair and draw:
struct EstimatorStats {
  std::string estimator;    // a registered estimator's label (softmax_estimator.h), or
                            // performer_is (000 Thm 3.2)
  std::string target;       // what kappa is: "exp(x.y)" or "exp(x^T M^T M y)"
  int64_t num_features = 0; // m
  double relative_error =
      0; // mean over pairs and draws of |kappa_hat - kappa| / kappa
  double relative_variance = 0; // mean over pairs of Var_draws(r)
  double variance =
      0; // mean over pairs of Var_draws(kappa_hat): Theorem 3.2's objective
  double closed_form_variance =
      0; // the same from ClosedFormVariance (what `variance` estimates)
};

// Lambda = U diag(lambda) U^T, U a Haar rotation, lambda log-spaced over [max /
// ratio, max]; fp64.
torch::Tensor AnisotropicCovariance(int64_t dim, double lambda_max,
                                    double lambda_ratio, uint64_t seed);

// Theorem 3.2: Sigma* = (I + 2 Lambda)(I - 2 Lambda)^-1 (same eigenvectors;
// eigenvalues (1 + 2 l) / (1 - 2 l)). Throws unless every eigenvalue of Lambda
// is in [0, 1/2).
torch::Tensor OptimalProposalCovariance(const torch::Tensor &lambda_DD);

// kappa_hat / kappa for each draw and pair: kappa_hat = (1/m) sum_j w(omega_j)
// Z(x, y, omega_j), Z = exp(omega.(x + y) - |x|^2/2 - |y|^2/2), omega ~ N(0,
// proposal) and w = N(omega; 0, I) / N(omega; 0, proposal) in log-space (w = 1
// for proposal I, undefined tensor); kappa = exp(x.y). Returns r_NP in fp64.
torch::Tensor EstimatorRatios(const torch::Tensor &x_PD,
                              const torch::Tensor &y_PD,
                              const torch::Tensor &proposal_DD,
                              int64_t num_features, int64_t draws,
                              uint64_t seed);

// The exact Var_omega[kappa_hat] per pair (Lemma 3.1's eq. 5):
// (E_psi[(p_I/psi)^2 Z^2] - kappa^2) / m with E_psi[(p_I/psi)^2 Z^2] =
// det(Sigma)^1/2 det(A)^-1/2 exp(2 u^T A^-1 u - |x|^2 - |y|^2), A = 2I -
// Sigma^-1, u = x + y (a Gaussian integral; needs A > 0, true for Sigma >= I
// such as Sigma*). Proposal I (undefined tensor) gives Performer's exp(2
// x.y)(exp(|x + y|^2) - 1) / m. Returns var_P in fp64.
torch::Tensor ClosedFormVariance(const torch::Tensor &x_PD,
                                 const torch::Tensor &y_PD,
                                 const torch::Tensor &proposal_DD,
                                 int64_t num_features);

// Every registered estimator (softmax_estimator.h, fitted to the pairs), then performer_is, at
// every m in `num_features`, on one Lambda and one set of pairs.
std::vector<EstimatorStats>
CompareEstimators(const SyntheticEstimatorOptions &options,
                  const std::vector<int64_t> &num_features);

// ---- (b) real q, k
// ------------------------------------------------------------------------------

// Anisotropy of a sample's covariance (fp64, centred, eigenvalues floored at
// 1e-12).
struct CovarianceSpectrum {
  double condition_number = 0; // lambda_max / lambda_min
  double effective_rank = 0;   // exp(entropy of lambda / sum lambda), in [1, D]
  double trace = 0;            // sum lambda (mean squared norm about the mean)
};
// samples_ND: N samples of dimension D (any float dtype).
CovarianceSpectrum Spectrum(const torch::Tensor &samples_ND);

// One kernel to compare against exact attention.
struct KernelSpec {
  std::string label; // how the table names it, e.g. "darkformer(whitening)"
  std::string name;  // registry name
  std::string options_yaml; // its YAML options section, inline
  bool calibrate =
      false; // darkformer: Calibrate(q, k, scale) before the forward
};

struct KernelError {
  std::string label;
  double relative_error =
      0; // |out - exact| / |exact| over the whole layer output
};

struct LayerDiagnostics {
  int64_t layer = 0;
  CovarianceSpectrum x, y; // of x = sqrt(s) q and y = sqrt(s) k, pooled over
                           // batch, heads, positions
  std::vector<KernelError> errors;
};

// q_BHLD, k_BHLD, v_BHLD as the layer's kernel sees them (normed, rotated, k
// and v repeated to H heads). The reference is exact causal softmax of s q.k
// without soft-cap or sliding window: the target every feature kernel
// estimates.
// ---- (c) the FAVOR estimators on real q, k
// The registered dense-exponential estimators (002: performer, gerf (A*), saderf, aderf, sderf) on
// one layer's x = sqrt(s) q and y = sqrt(s) k (k repeated to q's H heads): their parameters from the whole layer batch, pooled over
// batch, heads and positions as the kernels' Calibrate does; their estimates of exp(x.y) on `pairs`
// random causal pairs (one row and head, key position <= query position) over `draws` iid draws.
std::vector<EstimatorStats> CompareFavorEstimatorsOnLayer(const torch::Tensor &q_BHLD, const torch::Tensor &k_BHLD,
                                                          double scale, const std::vector<int64_t> &num_features,
                                                          int64_t pairs, int64_t draws, uint64_t seed);

LayerDiagnostics DiagnoseLayer(const torch::Tensor &q_BHLD,
                               const torch::Tensor &k_BHLD,
                               const torch::Tensor &v_BHLD, double scale,
                               int64_t layer,
                               const std::vector<KernelSpec> &kernels);

} // namespace darkformer
