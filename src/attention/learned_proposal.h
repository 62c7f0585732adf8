// A learned Sigma = M^T M (darkformer's M, per query head or shared) as an importance-sampling
// proposal for exp(x.y) on a layer's own x = sqrt(s) q and y = sqrt(s) k, beside Performer's
// proposal I on the same causal pairs and the same draws (000 Prop. 4.1: the estimator darkformer's
// target: softmax trains). What `kernel-check --estimators --weights` adds for a checkpoint that
// holds M: did learning the proposal lower the variance on the model's own queries and keys?
#pragma once

#include <torch/torch.h>

#include <vector>

#include "attention/kernel_diagnostics.h"

namespace darkformer {

struct ProposalStats {
  EstimatorStats stats;             // closed_form_variance: +inf where the variance is infinite
  double sigma_min_eigenvalue = 1;  // the smallest eigenvalue of Sigma over heads (finite needs > 1/2)
};

// Rows "proposal_I" and "learned_sigma" at each m, on `pairs` causal pairs drawn as
// CompareFavorEstimatorsOnLayer draws them; sigma_NDD has one Sigma per query head (N = H) or one
// for all (N = 1). q_BHLD and k_BHLD have the same H heads (keys repeated).
std::vector<ProposalStats> CompareLearnedProposalOnLayer(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD,
                                                         double scale, const torch::Tensor& sigma_NDD,
                                                         const std::vector<int64_t>& num_features, int64_t pairs,
                                                         int64_t draws, uint64_t seed);

}  // namespace darkformer
