// What `kernel-check --estimators` compares. A kernel that estimates a kernel value from m random
// features registers its estimator at the end of its own .cpp, as it registers itself
// (kernel_registry.h): the closed forms it draws from, fitted to a sample as its Calibrate fits
// the kernel. The comparison (kernel_diagnostics.h) reads them in the tables' order and names none.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "attention/derf_parameters.h"

namespace darkformer {

// One fitted estimator; every tensor fp64, one row per pair (x_PD, y_PD).
struct FittedEstimator {
  std::string target = "exp(x.y)";  // what kappa is
  // kappa per pair.
  std::function<torch::Tensor(const torch::Tensor& x_PD, const torch::Tensor& y_PD)> target_value;
  // kappa_hat / kappa for `draws` independent draws of m features: draws x P.
  std::function<torch::Tensor(const torch::Tensor& x_PD, const torch::Tensor& y_PD, int64_t num_features,
                              int64_t draws, uint64_t seed)>
      ratios;
  // Var(kappa_hat) of one feature per pair (m = 1; m features divide it by m).
  std::function<torch::Tensor(const torch::Tensor& x_PD, const torch::Tensor& y_PD)> variance_per_feature;
};

// x_ND, y_ND: the sample it is fitted on (x = sqrt(s) q, y = sqrt(s) k, pooled; fp64).
using EstimatorFit = std::function<FittedEstimator(const torch::Tensor& x_ND, const torch::Tensor& y_ND)>;

struct EstimatorEntry {
  std::string label;   // the comparison's row, e.g. "gerf_optimal"
  std::string kernel;  // the registered kernel it is the estimator of
  // FAVOR#'s dense-exponential family (002 sec. 4), parameters from second moments: the
  // comparison on a real layer's queries and keys runs these.
  bool dense_exponential = false;
  EstimatorFit fit;
};

// At the end of the kernel's .cpp:
//   [[maybe_unused]] const bool kEstimator = RegisterEstimator({"performer", "performer", true, fit});
bool RegisterEstimator(EstimatorEntry entry);
// In the tables' order of their kernels (KernelNamesInTableOrder), a kernel's own in the order it
// registered them.
std::vector<EstimatorEntry> RegisteredEstimators();

// exp(x.y) per pair.
torch::Tensor SoftmaxTargetValue(const torch::Tensor& x_PD, const torch::Tensor& y_PD);
// A member of FAVOR#'s family at fixed parameters (DerfEstimatorRatios, DerfClosedFormVariance).
FittedEstimator DerfEstimator(const DerfParameters& parameters);
// Fitted from the sample's DerfStatistics, as the kernel's Calibrate fits it.
EstimatorFit DerfFit(std::function<DerfParameters(const DerfStatistics&)> parameters_of);

}  // namespace darkformer
