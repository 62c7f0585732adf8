// Dense-exponential random features (DERFs, 002 sec. 4) and the closed-form variance-optimal
// parameters of two special cases, ADERF (002 Thm 4.2) and SDERF (Thm 4.3); docs/kernels.md
// derives them. With w ~ N(0, I_d) isotropic, A may be taken diagonal (a rotation of its
// eigenbasis moves into B), so one form covers every FAVOR kernel:
//   log f_k(w, x) = sum_l [log(1 - 4 a_l) / 4 + a_l w_l^2 + sqrt(1 - 4 a_l) w_l z_l] - |z|^2 / 2,
//   z = P_k x (k = 1 queries, k = 2 keys), P_1^T P_2 = I, every a_l < 1/8,
// i.e. B_k = diag(sqrt(1 - 4a)) P_k, C_k = -P_k^T P_k / 2, D = det(I - 4A)^{1/4}: Thm 4.1's
// conditions (B_1^T (I - 4A)^-1 B_2 = I), so f_1 f_2 is unbiased for exp(x.y).
//   performer: a = 0, P = I;  gerf: a = A* I, P = I;  saderf: P_1 = Psi, P_2 = Psi^-1;
//   aderf: a scalar, P_1 dense, P_2 = P_1^-T;  sderf: P_1 = P_2 orthogonal, a per coordinate.
// Everything here is fp64 on the CPU or the tensors' device; the kernels store fp32 copies.
#pragma once

#include <torch/torch.h>

namespace darkformer {

struct DerfParameters {
  torch::Tensor a_D;         // diagonal of A, each < 1/8
  torch::Tensor p_query_DD;  // P_1
  torch::Tensor p_key_DD;    // P_2, with P_1^T P_2 = I
};

// What the shifted log-variance objective (002 eq. 14, averaged over every (x_i, y_j) pair)
// depends on: second moments and means of queries and keys.
struct DerfStatistics {
  torch::Tensor m_query_DD, m_key_DD;  // mean x x^T, mean y y^T
  torch::Tensor mu_query_D, mu_key_D;  // mean x, mean y
  // From samples x_ND, y_ND (rows; fp64 inside). Refuses non-finite samples, naming `what`.
  static DerfStatistics Of(const torch::Tensor& x_ND, const torch::Tensor& y_ND, const std::string& what);
};

DerfParameters PerformerDerf(int64_t dim);
// GERF with A* of 002 eq. 13 (rho = mean |x + y|^2 / d from the statistics).
DerfParameters GerfDerf(const DerfStatistics& s);
// SADERF, 002 eq. 20: psi_l = (mean y_l^2 / mean x_l^2)^{1/4}, then A* of the transformed statistics.
DerfParameters SaderfDerf(const DerfStatistics& s);
// ADERF's global minimum (002 Thm 4.2): with M_k = Q_k L_k Q_k^T and the SVD
// L_2^{1/2} Q_2^T Q_1 L_1^{1/2} = U S V^T, P_1 = S^{1/2} V^T L_1^{-1/2} Q_1^T,
// P_2 = S^{1/2} U^T L_2^{-1/2} Q_2^T and a = A*(rho) with rho = 2 (tr S + mu_1.mu_2) / d.
// M_k needs to be nonsingular: it is taken as M_k + ridge (tr M_k / d) I; a side with no mass at
// all (tr M_k = 0) gives GERF's P = I.
DerfParameters AderfParameters(const DerfStatistics& s, double ridge);
// SDERF's global minimum (002 Thm 4.3): with M_3 = M_1 + M_2 + mu_1 mu_2^T + mu_2 mu_1^T =
// mean (x_i + y_j)(x_i + y_j)^T = Q_3 L_3 Q_3^T, P_1 = P_2 = Q_3^T and a_l = A*(L_3,ll) per
// coordinate. No inverse: a singular M_3 is fine (a_l = 0 on its null space).
DerfParameters SderfParameters(const DerfStatistics& s);

// 002 eq. 14 from the statistics: mean over pairs of log E[(f_1 f_2)^2] (= log(Var + exp(x.y)^2)),
// a 0-dim fp64 tensor, differentiable in the parameters.
torch::Tensor DerfObjective(const DerfParameters& p, const DerfStatistics& s);
// log E[(f_1(w, x) f_2(w, y))^2] per pair of rows of x_PD, y_PD (one feature, m = 1):
// sum_l [log(1 - 4a_l) - log(1 - 8a_l) / 2 + 2 (1 - 4a_l) u_l^2 / (1 - 8a_l)] - |z_1|^2 - |z_2|^2, u = z_1 + z_2.
torch::Tensor DerfLogSecondMoment(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD);
// Its variance: exp(log second moment) - exp(2 x.y), per pair (m = 1).
torch::Tensor DerfClosedFormVariance(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD);

// log phi(x) = log f_k(w_m, x) - log(m) / 2 for x_BNLD (already sqrt(s) q or k), w_MD, one side's
// a_D and P_DD, in the feature dtype (fp32, or fp64 for fp64 inputs).
torch::Tensor DerfLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& w_MD, const torch::Tensor& a_D,
                              const torch::Tensor& p_DD);
// kappa_hat / exp(x.y) for `draws` independent iid draws of m features: draws x P (kernel-check).
torch::Tensor DerfEstimatorRatios(const DerfParameters& p, const torch::Tensor& x_PD, const torch::Tensor& y_PD,
                                  int64_t num_features, int64_t draws, uint64_t seed);

}  // namespace darkformer
