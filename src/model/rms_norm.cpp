// Gemma RMSNorm (see rms_norm.h).
#include "model/rms_norm.h"

namespace darkformer {

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::zeros({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  // LibTorch's rms_norm: on CUDA one fused kernel each way, which saves x and each row's rsqrt for
  // the backward, not the normalised rows; elsewhere HF's ops, to the bit (x * rsqrt(mean(x^2) +
  // eps) * (1 + w)). Both in fp32: the scale (1 + w) too, as HF and gemma_pytorch take it.
  const auto scale = 1.0 + weight.to(torch::kFloat32);
  return torch::rms_norm(x.to(torch::kFloat32), {x.size(-1)}, scale, eps_).to(x.scalar_type());
}

}  // namespace darkformer
