// LFK kernel (see lfk_kernel.h).
#include "attention/lfk_kernel.h"

#include "attention/positive_features.h"

namespace darkformer {

LfkKernelImpl::LfkKernelImpl(const KernelShape& shape, const ConfigReader& options)
    : FeatureKernelBase(shape, FeatureKernelOptions::Read(options, /*with_redraw=*/false)) {
  options.RejectUnknown();
  // Same initial draw as a Performer layer with the same seed; training then moves W freely, so
  // there is nothing to redraw.
  const uint64_t seed = DrawSeed(options_.seed + 1000 * shape.layer_index, 0);
  W = register_parameter("W", DrawProjection(options_.projection, options_.num_features, shape.head_dim, seed));
}

torch::Tensor LfkKernelImpl::LogFeatures(const torch::Tensor& x_BHLD) const { return LogPositiveFeatures(x_BHLD, W); }

}  // namespace darkformer
