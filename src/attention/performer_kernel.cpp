// Performer / FAVOR+ attention (see performer_kernel.h).
#include "attention/performer_kernel.h"

#include "attention/positive_features.h"

namespace darkformer {

PerformerKernelImpl::PerformerKernelImpl(const KernelShape& shape, const ConfigReader& options)
    : FeatureKernelBase(shape, FeatureKernelOptions::Read(options, /*with_redraw=*/true)) {
  options.RejectUnknown();
  RegisterDraw(shape.head_dim);
}

torch::Tensor PerformerKernelImpl::LogFeatures(const torch::Tensor& x_BHLD) const {
  return LogPositiveFeatures(x_BHLD, projection_);
}

}  // namespace darkformer
