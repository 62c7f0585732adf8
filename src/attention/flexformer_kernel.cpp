// Flexformer attention (see flexformer_kernel.h).
#include "attention/flexformer_kernel.h"

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"

namespace darkformer {

FlexformerKernelImpl::Options FlexformerKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{SignedOptions::Read(reader, /*with_redraw=*/false)};
  const auto variant = reader.Get<std::string>(
      "variant", "stationary",
      KeySpec("stationary (004 eq. 5) or nonstationary (eq. 6, trainable pairs)").OneOf({"stationary", "nonstationary"}));
  o.nonstationary = variant == "nonstationary";
  reader.RejectUnknown();
  return o;
}

FlexformerKernelImpl::FlexformerKernelImpl(const KernelShape& shape, const Options& options)
    : SignedFeatureKernel(shape, options), nonstationary_(options.nonstationary) {
  // One draw (the layer's seed), the same for every head and for both members of a pair: at
  // initialisation the kernel is the trigonometric estimator of exp(x.y).
  const auto w_MD = DrawProjection(options_.projection, options_.num_features, shape.head_dim,
                                   DrawSeed(KernelSeed(options_.seed, shape), 0));
  auto init = w_MD.unsqueeze(0).repeat({shape.num_heads, 1, 1});
  if (nonstationary_) init = init.unsqueeze(1).repeat({1, 2, 1, 1});
  frequencies = register_parameter("frequencies", init.contiguous());
  tau = register_parameter("tau", torch::full({shape.num_heads}, std::log(2.0), torch::kFloat32));
}

torch::Tensor FlexformerKernelImpl::FourierFeatures(const torch::Tensor& x_BHLD) const {
  const auto x = x_BHLD.to(FeatureDtype(x_BHLD.scalar_type()));
  const auto w = frequencies.to(x.scalar_type());
  const double n = static_cast<double>(w.size(-2));
  if (!nonstationary_) {
    const auto proj_BHLN = Fp32Matmul(x, w.transpose(-1, -2).unsqueeze(0));
    return torch::cat({proj_BHLN.cos(), proj_BHLN.sin()}, -1) / std::sqrt(n);
  }
  // 004 eq. 6: W1' = (W1 + W2)/2, W2' = (W1 - W2)/2.
  const auto w1 = 0.5 * (w.select(1, 0) + w.select(1, 1)), w2 = 0.5 * (w.select(1, 0) - w.select(1, 1));
  const auto p1_BHLN = Fp32Matmul(x, w1.transpose(-1, -2).unsqueeze(0));
  const auto c2_BHLN = Fp32Matmul(x, w2.transpose(-1, -2).unsqueeze(0)).cos();
  return torch::cat({p1_BHLN.cos() * c2_BHLN, p1_BHLN.sin() * c2_BHLN}, -1) / std::sqrt(n);
}

torch::Tensor FlexformerKernelImpl::LogScale(const torch::Tensor& x_BHLD) const {
  const auto x = x_BHLD.to(FeatureDtype(x_BHLD.scalar_type()));
  return x.pow(2).sum(-1) / tau.to(x.scalar_type()).exp().view({1, -1, 1});
}

double FlexformerKernelImpl::MaxLogFeature(const torch::Tensor& x_BHLD) const { return LogScale(x_BHLD).max().item<double>(); }

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<FlexformerKernel>(
    "flexformer", 100, "Flexformer (004): trainable Fourier frequencies for the Gaussian factor, learnable exp(tau)");
}  // namespace

}  // namespace darkformer
