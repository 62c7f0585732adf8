// Trigonometric random-feature attention (see trig_kernel.h).
#include "attention/trig_kernel.h"

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/positive_features.h"

namespace darkformer {

TrigKernelImpl::Options TrigKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{SignedOptions::Read(reader, /*with_redraw=*/true)};
  reader.RejectUnknown();
  return o;
}

TrigKernelImpl::TrigKernelImpl(const KernelShape& shape, const Options& options) : SignedFeatureKernel(shape, options) {
  RegisterDraw(shape.head_dim);
}

torch::Tensor TrigKernelImpl::SignedFeatures(const torch::Tensor& x_BNLD) const {
  const auto x = x_BNLD.to(FeatureDtype(x_BNLD.scalar_type()));
  const auto proj_BNLM = torch::matmul(x, projection_.to(x.device(), x.scalar_type()).t());
  const double m = static_cast<double>(projection_.size(0));
  return torch::cat({proj_BNLM.sin(), proj_BNLM.cos()}, -1) / std::sqrt(m);
}

torch::Tensor TrigKernelImpl::LogScale(const torch::Tensor& x_BNLD) const {
  return 0.5 * x_BNLD.to(FeatureDtype(x_BNLD.scalar_type())).pow(2).sum(-1);
}

double TrigKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const {
  return (0.5 * x_BHLD.to(torch::kFloat32).pow(2).sum(-1)).max().item<double>();
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<TrigKernel>(
    "trig", 80, "RFA (001): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx]; signed features, composite path");
}  // namespace

}  // namespace darkformer
