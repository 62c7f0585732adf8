// Random and constant attention baselines (see baseline_kernels.h).
#include "attention/baseline_kernels.h"

#include "attention/document_mask.h"
#include "attention/kernel_registry.h"
#include "util/mixed_precision.h"

#include <ATen/CPUGeneratorImpl.h>

namespace darkformer {

RandomKernelImpl::Options RandomKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o;
  o.seed = reader.Get<int64_t>("seed", o.seed, "layer i draws from seed + 1000 i (+ 1000003 train.seed)");
  reader.RejectUnknown();
  return o;
}

RandomKernelImpl::RandomKernelImpl(const KernelShape& shape, const Options& options) {
  generator_ = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(KernelSeed(options.seed, shape)));
}

torch::Tensor RandomKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& /*k_BKLD*/,
                                        const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));  // weights are drawn per query head
  const int64_t batch = v_BHLD.size(0), heads = v_BHLD.size(1), length = v_BHLD.size(2);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto u_BHLL = v_BHLD.is_cpu() ? at::rand({batch, heads, length, length}, generator_, f32)
                                : torch::rand({batch, heads, length, length}, f32.device(v_BHLD.device()));
  if (call.causal) u_BHLL = u_BHLL.tril();
  if (call.document_ids_BL.defined()) u_BHLL = u_BHLL * SameDocument(call.document_ids_BL.to(u_BHLL.device()));
  const auto weights_BHLL = u_BHLL / u_BHLL.sum(-1, /*keepdim=*/true);
  return torch::matmul(weights_BHLL, v_BHLD.to(torch::kFloat32)).to(v_BHLD.scalar_type());
}

ConstantKernelImpl::Options ConstantKernelImpl::Options::Read(const ConfigReader& reader) {
  reader.RejectUnknown();
  return {};
}

ConstantKernelImpl::ConstantKernelImpl(const KernelShape& /*shape*/, const Options& /*options*/) {}

torch::Tensor ConstantKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& /*k_BKLD*/,
                                          const torch::Tensor& v_BKLD, const AttentionCall& call) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));
  const auto v = v_BHLD.to(torch::kFloat32);
  if (!call.causal) return v.mean(2, /*keepdim=*/true).expand_as(v).to(v_BHLD.scalar_type());
  // Running mean: sum_{j <= i} v_j / (i + 1), summed in fp32.
  const auto counts_L1 = torch::arange(1, v.size(2) + 1, v.options()).unsqueeze(-1);
  return (v.cumsum(2) / counts_L1).to(v_BHLD.scalar_type());
}

namespace {

struct ValueHistory : DecodeState {
  torch::Tensor v_BHSD;  // every token's v, per query head, fp32
  int64_t Bytes() const override { return NbytesOrZero(v_BHSD); }
};

struct RunningSum : DecodeState {
  torch::Tensor sum_BH1D;  // fp32
  int64_t Bytes() const override { return NbytesOrZero(sum_BH1D); }
};

}  // namespace

torch::Tensor RandomKernelImpl::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                       const torch::Tensor& /*k_BKTD*/, const torch::Tensor& v_BKTD,
                                       const AttentionCall& /*call*/) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  if (!state) state = std::make_unique<ValueHistory>();
  auto& s = dynamic_cast<ValueHistory&>(*state);
  const auto v_new = RepeatKvHeads(v_BKTD, q_BHTD.size(1)).to(torch::kFloat32);
  s.v_BHSD = s.v_BHSD.defined() ? torch::cat({s.v_BHSD, v_new}, 2) : v_new;
  const int64_t batch = v_new.size(0), heads = v_new.size(1), new_tokens = v_new.size(2), total = s.v_BHSD.size(2);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto u_BHTS = v_new.is_cpu() ? at::rand({batch, heads, new_tokens, total}, generator_, f32)
                               : torch::rand({batch, heads, new_tokens, total}, f32.device(v_new.device()));
  // New token t (position tokens + t) draws weights for positions <= its own.
  u_BHTS = u_BHTS.tril(total - new_tokens);
  s.tokens += new_tokens;
  return torch::matmul(u_BHTS / u_BHTS.sum(-1, /*keepdim=*/true), s.v_BHSD).to(v_BKTD.scalar_type());
}

torch::Tensor ConstantKernelImpl::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                         const torch::Tensor& /*k_BKTD*/, const torch::Tensor& v_BKTD,
                                         const AttentionCall& /*call*/) {
  NoAutocastGuard fp32;  // computes in fp32 even when called inside autocast
  if (!state) state = std::make_unique<RunningSum>();
  auto& s = dynamic_cast<RunningSum&>(*state);
  const auto v = RepeatKvHeads(v_BKTD, q_BHTD.size(1)).to(torch::kFloat32);
  auto sums_BHTD = v.cumsum(2);
  if (s.sum_BH1D.defined()) sums_BHTD = sums_BHTD + s.sum_BH1D;
  const int64_t new_tokens = v.size(2);
  const auto counts_T1 = torch::arange(s.tokens + 1, s.tokens + new_tokens + 1, v.options()).unsqueeze(-1);
  s.sum_BH1D = sums_BHTD.narrow(2, new_tokens - 1, 1);
  s.tokens += new_tokens;
  return (sums_BHTD / counts_T1).to(v_BKTD.scalar_type());
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegisteredRandom = RegisterKernel<RandomKernel>(
    "random", 110, "uniform random weights over allowed positions, normalised");
[[maybe_unused]] const bool kRegisteredConstant = RegisterKernel<ConstantKernel>(
    "constant", 120, "equal weights over allowed positions (running mean of v)");
}  // namespace

}  // namespace darkformer
