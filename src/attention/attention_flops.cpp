// Attention FLOPs per token (see attention_flops.h).
#include "attention/attention_flops.h"

#include <algorithm>

#include "attention/log_feature_kernel.h"
#include "attention/signed_feature_kernel.h"

namespace darkformer {

namespace {

// The feature dimension a kernel's map produces, read off one dummy row on the kernel's device.
int64_t FeatureDim(const FeatureKernelBase& kernel, int64_t heads, int64_t head_dim) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::kCPU;
  for (const auto& tensor : kernel.buffers()) device = tensor.device();
  for (const auto& tensor : kernel.parameters()) device = tensor.device();
  const auto x = torch::zeros({1, heads, 1, head_dim}, torch::TensorOptions().device(device));
  if (const auto* log_form = dynamic_cast<const LogFeatureKernel*>(&kernel)) return log_form->LogFeatures(x).size(-1);
  return dynamic_cast<const SignedFeatureKernel&>(kernel).SignedFeatures(x).size(-1);
}

}  // namespace

double AttentionForwardFlopsPerToken(const AttentionKernelImpl& kernel, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, int64_t length) {
  const double h = heads, d = head_dim, l = length;
  const auto* features = dynamic_cast<const FeatureKernelBase*>(&kernel);
  if (features == nullptr) {
    return kernel.kernel_name() == "exact" ? 4 * l * d * h : 2 * l * d * h;
  }
  const double m = FeatureDim(*features, heads, head_dim), v = d + 1;
  const double c = std::min<int64_t>(features->options().chunk_size, length);
  const auto* log_form = dynamic_cast<const LogFeatureKernel*>(features);
  const double rows = log_form != nullptr && log_form->KeysPerQueryHead() ? h : (log_form ? kv_heads : h);
  return h * (2 * d * m + 2 * c * (m + v) + 2 * m * v) + rows * (2 * d * m + 2 * m * v);
}

}  // namespace darkformer
