// DERF parameters and estimators (see derf_parameters.h; derivation in docs/kernels.md).
#include "attention/derf_parameters.h"

#include <cmath>

#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"
#include "util/error.h"

namespace darkformer {

namespace {

constexpr auto kF64 = torch::kFloat64;

torch::Tensor Eye(int64_t d, const torch::Tensor& like) { return torch::eye(d, like.options().dtype(kF64)); }

// A*(c) of 002 eq. 13 per coordinate (Lemma A.1 with d = 1), elementwise: c = 0 gives 0.
torch::Tensor OptimalA(const torch::Tensor& c) {
  const auto r = c.clamp_min(0);
  return (1 - 2 * r - ((2 * r + 1).pow(2) + 8 * r).sqrt()) / 16;
}

// mean over pairs of u u^T (u = z_1 + z_2, z_k = P_k x) and of |z_1|^2 + |z_2|^2.
std::pair<torch::Tensor, torch::Tensor> TransformedMoments(const DerfParameters& p, const DerfStatistics& s) {
  const auto& p1 = p.p_query_DD;
  const auto& p2 = p.p_key_DD;
  const auto m1 = torch::matmul(torch::matmul(p1, s.m_query_DD), p1.t());
  const auto m2 = torch::matmul(torch::matmul(p2, s.m_key_DD), p2.t());
  const auto mu1 = torch::matmul(p1, s.mu_query_D), mu2 = torch::matmul(p2, s.mu_key_D);
  const auto uu = m1 + m2 + torch::outer(mu1, mu2) + torch::outer(mu2, mu1);
  return {uu, m1.trace() + m2.trace()};
}

}  // namespace

DerfStatistics DerfStatistics::Of(const torch::Tensor& x_ND, const torch::Tensor& y_ND, const std::string& what) {
  const auto x = x_ND.to(kF64), y = y_ND.to(kF64);
  DF_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(1) == y.size(1) && x.size(0) > 0 && y.size(0) > 0,
           what << ": queries " << x.sizes() << " and keys " << y.sizes() << " must be N x d with one d");
  DF_CHECK(torch::isfinite(x).all().item<bool>() && torch::isfinite(y).all().item<bool>(),
           what << ": the calibration batch holds non-finite queries or keys");
  DerfStatistics s;
  s.m_query_DD = torch::matmul(x.t(), x) / static_cast<double>(x.size(0));
  s.m_key_DD = torch::matmul(y.t(), y) / static_cast<double>(y.size(0));
  s.mu_query_D = x.mean(0);
  s.mu_key_D = y.mean(0);
  return s;
}

DerfParameters PerformerDerf(int64_t dim) {
  const auto eye = torch::eye(dim, kF64);
  return {torch::zeros({dim}, kF64), eye, eye.clone()};
}

DerfParameters GerfDerf(const DerfStatistics& s) {
  const int64_t d = s.mu_query_D.size(0);
  const auto rho = (s.m_query_DD.trace() + s.m_key_DD.trace() + 2 * s.mu_query_D.dot(s.mu_key_D)) / d;
  const auto eye = Eye(d, s.mu_query_D);
  return {OptimalA(rho).expand({d}).clone(), eye, eye.clone()};
}

DerfParameters SaderfDerf(const DerfStatistics& s) {
  const int64_t d = s.mu_query_D.size(0);
  const auto x_sq = s.m_query_DD.diagonal(), y_sq = s.m_key_DD.diagonal();
  const auto valid = (x_sq > 0) & (y_sq > 0);  // a coordinate with no mass on a side keeps 1
  const auto psi = torch::where(valid, (y_sq / x_sq.clamp_min(1e-300)).pow(0.25), torch::ones_like(x_sq));
  DerfParameters p{torch::zeros({d}, kF64), torch::diag(psi), torch::diag(1 / psi)};
  const auto [uu, unused] = TransformedMoments(p, s);
  p.a_D = OptimalA(uu.trace() / d).expand({d}).clone();
  return p;
}

DerfParameters AderfParameters(const DerfStatistics& s, double ridge) {
  DF_CHECK(ridge > 0 && std::isfinite(ridge), "AderfParameters: ridge must be positive, got " << ridge);
  const int64_t d = s.mu_query_D.size(0);
  const auto eye = Eye(d, s.mu_query_D);
  const double trace_1 = s.m_query_DD.trace().item<double>(), trace_2 = s.m_key_DD.trace().item<double>();
  if (!(trace_1 > 0) || !(trace_2 > 0)) return GerfDerf(s);  // no mass on a side: nothing to rescale
  // Thm 4.2 needs M_1, M_2 nonsingular: a ridge relative to the mean eigenvalue (docs/kernels.md).
  const auto m1 = s.m_query_DD + ridge * trace_1 / d * eye, m2 = s.m_key_DD + ridge * trace_2 / d * eye;
  const auto [l1, q1] = torch::linalg_eigh(0.5 * (m1 + m1.t()));
  const auto [l2, q2] = torch::linalg_eigh(0.5 * (m2 + m2.t()));
  // Clamping keeps eigh's rounding (a ridge-sized eigenvalue computed as slightly less) positive.
  const auto r1 = l1.clamp_min(ridge * trace_1 / d * 0.5), r2 = l2.clamp_min(ridge * trace_2 / d * 0.5);
  const auto f1 = q1 * r1.sqrt(), f2 = q2 * r2.sqrt();  // M_k = F_k F_k^T
  const auto [u, sv, vh] = torch::linalg_svd(torch::matmul(f2.t(), f1), /*full_matrices=*/false, std::nullopt);
  const auto root_s = sv.sqrt().unsqueeze(1);
  DerfParameters p;
  p.p_query_DD = torch::matmul(root_s * vh, (q1 / r1.sqrt()).t());
  p.p_key_DD = torch::matmul(root_s * u.t(), (q2 / r2.sqrt()).t());
  // rho of Thm 4.2: the minimum over P of mean |P_1 x + P_2 y|^2 / d, 2 (tr S + mu_1.mu_2) / d.
  const auto rho = 2 * (sv.sum() + s.mu_query_D.dot(s.mu_key_D)) / d;
  p.a_D = OptimalA(rho).expand({d}).clone();
  return p;
}

DerfParameters SderfParameters(const DerfStatistics& s) {
  const auto m3 = s.m_query_DD + s.m_key_DD + torch::outer(s.mu_query_D, s.mu_key_D) +
                  torch::outer(s.mu_key_D, s.mu_query_D);
  const auto [l3, q3] = torch::linalg_eigh(0.5 * (m3 + m3.t()));
  const auto rotation = q3.t().contiguous();
  // Each eigen-direction gets its own A* (larger second moment -> more negative a_l).
  return {OptimalA(l3), rotation, rotation.clone()};
}

torch::Tensor DerfObjective(const DerfParameters& p, const DerfStatistics& s) {
  const auto a = p.a_D.to(kF64);
  const auto [uu, z_sq] = TransformedMoments(p, s);
  const auto per_coordinate = (1 - 4 * a).log() - 0.5 * (1 - 8 * a).log() + 2 * (1 - 4 * a) / (1 - 8 * a) * uu.diagonal();
  return per_coordinate.sum() - z_sq;
}

torch::Tensor DerfLogSecondMoment(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD) {
  const auto a = p.a_D.to(kF64);
  const auto z1 = torch::matmul(x_PD.to(kF64), p.p_query_DD.t()), z2 = torch::matmul(y_PD.to(kF64), p.p_key_DD.t());
  const auto constant = ((1 - 4 * a).log() - 0.5 * (1 - 8 * a).log()).sum();
  return constant + (2 * (1 - 4 * a) / (1 - 8 * a) * (z1 + z2).pow(2)).sum(1) - z1.pow(2).sum(1) - z2.pow(2).sum(1);
}

torch::Tensor DerfClosedFormVariance(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD) {
  const auto xy = (x_PD.to(kF64) * y_PD.to(kF64)).sum(1);
  return DerfLogSecondMoment(p, x_PD, y_PD).exp() - (2 * xy).exp();
}

torch::Tensor DerfLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& w_MD, const torch::Tensor& a_D,
                              const torch::Tensor& p_DD) {
  const auto dtype = FeatureDtype(x_BNLD.scalar_type());
  const auto x = x_BNLD.to(dtype);
  const auto w = w_MD.to(x.device(), dtype), a = a_D.to(x.device(), dtype), p = p_DD.to(x.device(), dtype);
  const double m = static_cast<double>(w.size(-2));
  const auto one_minus_4a = 1 - 4 * a;
  const auto z = Fp32Matmul(x, p.t());
  // log D + sum_l a_l w_l^2 - log(m) / 2 per feature, then B w^T x + x^T C x per position
  // (w is M x D, or a stack of draws N x M x D against x of batch 1 or N).
  const auto per_feature_M = 0.25 * one_minus_4a.log().sum() + torch::matmul(w.pow(2), a) - 0.5 * std::log(m);
  return Fp32Matmul(z * one_minus_4a.sqrt(), w.transpose(-1, -2)) + per_feature_M.unsqueeze(-2) -
         0.5 * z.pow(2).sum(-1, /*keepdim=*/true);
}

torch::Tensor DerfEstimatorRatios(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD,
                                  int64_t num_features, int64_t draws, uint64_t seed) {
  const auto x = x_PD.to(kF64), y = y_PD.to(kF64);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto w_NMD = torch::randn({draws, num_features, x.size(1)}, generator, kF64);
  const auto lx_NPM = DerfLogFeatures(x.unsqueeze(0), w_NMD, p.a_D, p.p_query_DD);
  const auto ly_NPM = DerfLogFeatures(y.unsqueeze(0), w_NMD, p.a_D, p.p_key_DD);
  return torch::exp(torch::logsumexp(lx_NPM + ly_NPM, -1) - (x * y).sum(-1));
}

}  // namespace darkformer
