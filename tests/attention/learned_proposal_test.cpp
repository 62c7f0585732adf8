// A learned Sigma as an importance-sampling proposal on a layer's queries and keys
// (learned_proposal.h): Sigma = I reproduces proposal I on the same pairs and draws; Theorem 3.2's
// Sigma* (000) lowers the exact variance for anisotropic Gaussian inputs; a Sigma with an
// eigenvalue at or below 1/2 reports an infinite variance; mis-shaped Sigma is refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "attention/learned_proposal.h"

namespace darkformer {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// q, k (B = 1, H heads, L positions) with rows ~ N(0, Lambda): scale 1, so x = q and y = k.
std::pair<torch::Tensor, torch::Tensor> GaussianQueriesKeys(const torch::Tensor& lambda_DD, int64_t heads, int64_t length) {
  torch::manual_seed(9);
  const auto l_DD = torch::linalg_cholesky(lambda_DD);
  const int64_t d = lambda_DD.size(0);
  return {torch::matmul(torch::randn({1, heads, length, d}, kF64), l_DD.t()),
          torch::matmul(torch::randn({1, heads, length, d}, kF64), l_DD.t())};
}

TEST(LearnedProposal, IdentitySigmaIsProposalIOnTheSamePairsAndDraws) {
  const int64_t heads = 2, d = 4;
  const auto [q, k] = GaussianQueriesKeys(AnisotropicCovariance(d, 0.3, 10.0, 1), heads, 16);
  const auto eye = torch::eye(d, kF64).unsqueeze(0).repeat({heads, 1, 1});
  const auto rows = CompareLearnedProposalOnLayer(q, k, 1.0, eye, {8, 32}, 64, 50, 3);
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); i += 2) {
    const auto &plain = rows[i].stats, &learned = rows[i + 1].stats;
    EXPECT_EQ(plain.estimator, "proposal_I");
    EXPECT_EQ(learned.estimator, "learned_sigma");
    EXPECT_EQ(plain.num_features, learned.num_features);
    EXPECT_NEAR(learned.relative_error, plain.relative_error, 1e-10 * plain.relative_error);
    EXPECT_NEAR(learned.relative_variance, plain.relative_variance, 1e-10 * plain.relative_variance);
    EXPECT_NEAR(learned.closed_form_variance, plain.closed_form_variance, 1e-10 * plain.closed_form_variance);
    EXPECT_DOUBLE_EQ(rows[i + 1].sigma_min_eigenvalue, 1.0);
  }
}

// Theorem 3.2 (2): for x, y ~ N(0, Lambda) with Lambda anisotropic, N(0, Sigma*) has a lower
// expected variance than N(0, I). One Sigma shared by all heads (N = 1).
TEST(LearnedProposal, OptimalSigmaLowersTheExactVariance) {
  const int64_t d = 6;
  const auto lambda = AnisotropicCovariance(d, 0.4, 100.0, 2);
  const auto [q, k] = GaussianQueriesKeys(lambda, 3, 64);
  const auto rows = CompareLearnedProposalOnLayer(q, k, 1.0, OptimalProposalCovariance(lambda).unsqueeze(0), {16}, 512, 20, 4);
  ASSERT_EQ(rows.size(), 2u);
  std::cout << "[learned proposal] exact variance, proposal I " << rows[0].stats.closed_form_variance << ", Sigma* "
            << rows[1].stats.closed_form_variance << "\n";
  EXPECT_LT(rows[1].stats.closed_form_variance, rows[0].stats.closed_form_variance);
  EXPECT_GE(rows[1].sigma_min_eigenvalue, 1.0);  // Sigma* = (I + 2 Lambda)(I - 2 Lambda)^-1 >= I
}

TEST(LearnedProposal, AnEigenvalueAtMostOneHalfHasInfiniteVariance) {
  const int64_t heads = 2, d = 4;
  const auto [q, k] = GaussianQueriesKeys(AnisotropicCovariance(d, 0.3, 10.0, 1), heads, 16);
  auto sigma = torch::eye(d, kF64).unsqueeze(0).repeat({heads, 1, 1});
  sigma[1][2][2] = 0.4;  // head 1 only
  const auto rows = CompareLearnedProposalOnLayer(q, k, 1.0, sigma, {8}, 64, 20, 5);
  EXPECT_TRUE(std::isfinite(rows[0].stats.closed_form_variance));
  EXPECT_TRUE(std::isinf(rows[1].stats.closed_form_variance));
  EXPECT_DOUBLE_EQ(rows[1].sigma_min_eigenvalue, 0.4);
  EXPECT_TRUE(std::isfinite(rows[1].stats.relative_error));  // the draws themselves stay finite
}

TEST(LearnedProposal, RefusesASigmaThatDoesNotMatchTheHeads) {
  const auto [q, k] = GaussianQueriesKeys(torch::eye(4, kF64) * 0.1, 2, 8);
  EXPECT_ANY_THROW(CompareLearnedProposalOnLayer(q, k, 1.0, torch::eye(4, kF64).repeat({3, 1, 1}), {8}, 16, 4, 0));
  EXPECT_ANY_THROW(CompareLearnedProposalOnLayer(q, k, 1.0, torch::eye(3, kF64).unsqueeze(0), {8}, 16, 4, 0));
}

}  // namespace
}  // namespace darkformer
