// LFK kernel (see lfk_kernel.h).
#include "attention/lfk_kernel.h"

#include "attention/kernel_registry.h"
#include "attention/positive_features.h"

namespace darkformer {

LfkKernelImpl::Options LfkKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/false, /*with_op=*/true)};
  reader.RejectUnknown();
  return o;
}

LfkKernelImpl::LfkKernelImpl(const KernelShape& shape, const Options& options)
    : LogFeatureKernel(shape, options.features) {
  // Same initial draw as a Performer layer with the same seed; training then moves W freely, so
  // there is nothing to redraw.
  const uint64_t seed = DrawSeed(KernelSeed(options_.seed, shape), 0);
  W = register_parameter("W", DrawProjection(options_.projection, options_.num_features, shape.head_dim, seed));
}

// params = {W}, trainable.
torch::Tensor LfkKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                             bool /*is_query*/) const {
  return LogPositiveFeatures(x_BNLD, params.at(0));
}

std::vector<torch::Tensor> LfkKernelImpl::FeatureParams() const { return {W}; }

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<LfkKernel>(
    "lfk", 30, "Performer features with a trainable W (initialised by a draw)");
}  // namespace

}  // namespace darkformer
