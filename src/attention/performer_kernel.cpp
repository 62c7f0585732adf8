// Performer / FAVOR+ attention (see performer_kernel.h).
#include "attention/performer_kernel.h"

#include "attention/kernel_registry.h"
#include "attention/positive_features.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

PerformerKernelImpl::Options PerformerKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/true, /*with_op=*/true)};
  reader.RejectUnknown();
  return o;
}

PerformerKernelImpl::PerformerKernelImpl(const KernelShape& shape, const Options& options)
    : LogFeatureKernel(shape, options.features) {
  RegisterDraw(shape.head_dim);
}

// params = {W}: the drawn projection (a buffer: no gradient).
torch::Tensor PerformerKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                                   bool /*is_query*/) const {
  return LogPositiveFeatures(x_BNLD, params.at(0));
}

std::vector<torch::Tensor> PerformerKernelImpl::FeatureParams() const { return {projection_}; }

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<PerformerKernel>(
    "performer", 20, "FAVOR+: phi(x) = exp(Wx - |x|^2/2)/sqrt(m), W rows ~ N(0, I)");
// Its estimator (softmax_estimator.h): FAVOR#'s family at a = 0, P = I.
[[maybe_unused]] const bool kEstimator = RegisterEstimator(
    {"performer", "performer", /*dense_exponential=*/true,
     DerfFit([](const DerfStatistics& s) { return PerformerDerf(s.mu_query_D.size(0)); })});
}  // namespace

}  // namespace darkformer
