// The estimators' registry (see softmax_estimator.h).
#include "attention/softmax_estimator.h"

#include <algorithm>
#include <map>

#include "attention/kernel_registry.h"
#include "util/error.h"

namespace darkformer {

namespace {

// Filled by the kernels' static registrations, before main.
std::vector<EstimatorEntry>& Entries() {
  static std::vector<EstimatorEntry> entries;
  return entries;
}

}  // namespace

bool RegisterEstimator(EstimatorEntry entry) {
  DF_CHECK(!entry.label.empty() && !entry.kernel.empty() && entry.fit,
           "RegisterEstimator: an estimator needs a label, its kernel and its fit");
  for (const auto& e : Entries())
    DF_CHECK(e.label != entry.label, "RegisterEstimator: '" << entry.label << "' is registered twice");
  Entries().push_back(std::move(entry));
  return true;
}

std::vector<EstimatorEntry> RegisteredEstimators() {
  std::map<std::string, size_t> row;
  const auto names = KernelNamesInTableOrder();
  for (size_t i = 0; i < names.size(); ++i) row[names[i]] = i;
  auto out = Entries();
  for (const auto& e : out)
    DF_CHECK(row.count(e.kernel), "estimator '" << e.label << "' names kernel '" << e.kernel
                                                << "', which is not registered");
  std::stable_sort(out.begin(), out.end(),
                   [&](const EstimatorEntry& a, const EstimatorEntry& b) { return row[a.kernel] < row[b.kernel]; });
  return out;
}

torch::Tensor SoftmaxTargetValue(const torch::Tensor& x_PD, const torch::Tensor& y_PD) {
  return torch::exp((x_PD.to(torch::kFloat64) * y_PD.to(torch::kFloat64)).sum(-1));
}

FittedEstimator DerfEstimator(const DerfParameters& parameters) {
  FittedEstimator e;
  e.target_value = SoftmaxTargetValue;
  e.ratios = [parameters](const torch::Tensor& x, const torch::Tensor& y, int64_t m, int64_t draws, uint64_t seed) {
    return DerfEstimatorRatios(parameters, x, y, m, draws, seed);
  };
  e.variance_per_feature = [parameters](const torch::Tensor& x, const torch::Tensor& y) {
    return DerfClosedFormVariance(parameters, x, y);
  };
  return e;
}

EstimatorFit DerfFit(std::function<DerfParameters(const DerfStatistics&)> parameters_of) {
  return [parameters_of](const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
    return DerfEstimator(parameters_of(DerfStatistics::Of(x_ND, y_ND, "kernel-check --estimators")));
  };
}

}  // namespace darkformer
