// A learned proposal against Performer's on real queries and keys (see learned_proposal.h).
#include "attention/learned_proposal.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <string>

#include "util/error.h"

namespace darkformer {

std::vector<ProposalStats> CompareLearnedProposalOnLayer(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD,
                                                         double scale, const torch::Tensor& sigma_NDD,
                                                         const std::vector<int64_t>& num_features, int64_t pairs,
                                                         int64_t draws, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const int64_t batch = q_BHLD.size(0), heads = q_BHLD.size(1), length = q_BHLD.size(2), d = q_BHLD.size(3);
  DF_CHECK(k_BHLD.sizes() == q_BHLD.sizes(), "CompareLearnedProposalOnLayer: k " << k_BHLD.sizes() << " must match q " << q_BHLD.sizes());
  DF_CHECK(sigma_NDD.dim() == 3 && (sigma_NDD.size(0) == 1 || sigma_NDD.size(0) == heads) && sigma_NDD.size(1) == d &&
               sigma_NDD.size(2) == d,
           "CompareLearnedProposalOnLayer: Sigma " << sigma_NDD.sizes() << " must be 1 or " << heads << " x " << d << " x " << d);
  const double root = std::sqrt(scale);
  const auto x_BHLD = q_BHLD.to(torch::kFloat64) * root, y_BHLD = k_BHLD.to(torch::kFloat64) * root;
  const auto sigma = sigma_NDD.to(torch::kFloat64);
  // Causal pairs as CompareFavorEstimatorsOnLayer draws them, then sorted by head so each head's
  // pairs meet its own Sigma.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto b = torch::randint(batch, {pairs}, generator, torch::kInt64);
  const auto h = std::get<0>(torch::randint(heads, {pairs}, generator, torch::kInt64).sort());
  const auto i = torch::randint(length, {pairs}, generator, torch::kInt64);
  const auto j = (torch::rand({pairs}, generator, torch::kFloat64) * (i + 1).to(torch::kFloat64)).floor().to(torch::kInt64);
  const auto x_PD = x_BHLD.index({b, h, i}), y_PD = y_BHLD.index({b, h, j});
  const auto kappa_P = (x_PD * y_PD).sum(-1).exp();
  const double sigma_min = torch::linalg_eigvalsh(sigma).min().item<double>();
  std::vector<ProposalStats> out;
  for (int64_t m : num_features) {
    const uint64_t stream = seed + 1000003ull * static_cast<uint64_t>(m);
    // The same z for both proposals (omega = L z): a paired comparison.
    std::vector<torch::Tensor> learned_ratios, learned_variance;
    for (int64_t head = 0; head < heads; ++head) {
      const auto rows = (h == head).nonzero().flatten();
      if (rows.numel() == 0) continue;
      const auto sigma_DD = sigma[sigma.size(0) == 1 ? 0 : head];
      learned_ratios.push_back(EstimatorRatios(x_PD.index({rows}), y_PD.index({rows}), sigma_DD, m, draws, stream));
      // 000 eq. 5's second moment is finite only while 2I - Sigma^-1 > 0.
      const bool finite = torch::linalg_eigvalsh(sigma_DD).min().item<double>() > 0.5;
      learned_variance.push_back(finite ? ClosedFormVariance(x_PD.index({rows}), y_PD.index({rows}), sigma_DD, m)
                                        : torch::full({rows.numel()}, std::numeric_limits<double>::infinity(),
                                                      torch::kFloat64));
    }
    const auto summarise = [&](const std::string& label, const torch::Tensor& r_NP, const torch::Tensor& variance_P) {
      ProposalStats s;
      s.stats.estimator = label;
      s.stats.target = "exp(x.y)";
      s.stats.num_features = m;
      s.stats.relative_error = (r_NP - 1).abs().mean().item<double>();
      s.stats.relative_variance = r_NP.var(0).mean().item<double>();
      s.stats.variance = (r_NP * kappa_P).var(0).mean().item<double>();
      s.stats.closed_form_variance = variance_P.mean().item<double>();
      s.sigma_min_eigenvalue = sigma_min;
      return s;
    };
    out.push_back(summarise("proposal_I", EstimatorRatios(x_PD, y_PD, torch::Tensor(), m, draws, stream),
                            ClosedFormVariance(x_PD, y_PD, torch::Tensor(), m)));
    out.push_back(summarise("learned_sigma", torch::cat(learned_ratios, 1), torch::cat(learned_variance)));
  }
  return out;
}

}  // namespace darkformer
