// Random and constant attention baselines (see baseline_kernels.h).
#include "attention/baseline_kernels.h"

#include <ATen/CPUGeneratorImpl.h>

namespace darkformer {

RandomKernelImpl::RandomKernelImpl(const KernelShape& shape, const ConfigReader& options) {
  const auto seed = options.Get<int64_t>("seed", 0);
  options.RejectUnknown();
  generator_ = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(KernelSeed(seed, shape)));
}

torch::Tensor RandomKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& /*k_BKLD*/,
                                        const torch::Tensor& v_BKLD, const AttentionCall& call) {
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));  // weights are drawn per query head
  const int64_t batch = v_BHLD.size(0), heads = v_BHLD.size(1), length = v_BHLD.size(2);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto u_BHLL = v_BHLD.is_cpu() ? at::rand({batch, heads, length, length}, generator_, f32)
                                : torch::rand({batch, heads, length, length}, f32.device(v_BHLD.device()));
  if (call.causal) u_BHLL = u_BHLL.tril();
  const auto weights_BHLL = u_BHLL / u_BHLL.sum(-1, /*keepdim=*/true);
  return torch::matmul(weights_BHLL, v_BHLD.to(torch::kFloat32)).to(v_BHLD.scalar_type());
}

ConstantKernelImpl::ConstantKernelImpl(const KernelShape& /*shape*/, const ConfigReader& options) {
  options.RejectUnknown();
}

torch::Tensor ConstantKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& /*k_BKLD*/,
                                          const torch::Tensor& v_BKLD, const AttentionCall& call) {
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));
  const auto v = v_BHLD.to(torch::kFloat32);
  if (!call.causal) return v.mean(2, /*keepdim=*/true).expand_as(v).to(v_BHLD.scalar_type());
  // Running mean: sum_{j <= i} v_j / (i + 1), summed in fp32.
  const auto counts_L1 = torch::arange(1, v.size(2) + 1, v.options()).unsqueeze(-1);
  return (v.cumsum(2) / counts_L1).to(v_BHLD.scalar_type());
}

}  // namespace darkformer
