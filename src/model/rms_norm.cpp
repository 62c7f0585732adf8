// Gemma RMSNorm (see rms_norm.h).
#include "model/rms_norm.h"

namespace darkformer {

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::zeros({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto x_f32 = x.to(torch::kFloat32);
  const auto normed = x_f32 * torch::rsqrt(x_f32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return (normed * (1.0 + weight.to(torch::kFloat32))).to(x.scalar_type());
}

}  // namespace darkformer
