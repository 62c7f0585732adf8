// The cases of op: cuda's device tests (device_cuda_op_test.cpp, cuda_op_scratch_test.cpp): the
// kernels made for them, their inputs (ordinary, sharp opposed and jumping rows), a forward +
// backward on a device, and the comparison with the chunk loop in fp64 on the CPU.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_op.h"
#include "cuda/test_device.h"

namespace darkformer::cuda_op_cases {

inline constexpr int64_t kHeads = 2, kKvHeads = 1, kLength = 40, kDim = 8, kFeatures = 16, kChunk = 16;

// sub_chunk: op: cuda's key (0: absent, its default); segment_chunks, pairs and precompute: its
// others (0, "", false: absent).
inline AttentionKernel Make(const std::string& name, const std::string& op, double projection_norm, int64_t chunk = kChunk,
                     int64_t features = kFeatures, int64_t heads = kHeads, int64_t sub_chunk = 0,
                     int64_t segment_chunks = 0, const std::string& pairs = "", bool precompute = false) {
  KernelShape shape{heads, kDim};
  const std::string yaml =
      "{num_features: " + std::to_string(features) + ", chunk_size: " + std::to_string(chunk) + ", op: " + op +
      (sub_chunk > 0 ? ", sub_chunk: " + std::to_string(sub_chunk) : "") +
      (segment_chunks > 0 ? ", segment_chunks: " + std::to_string(segment_chunks) : "") +
      (pairs.empty() ? "" : ", pairs: " + pairs) + (precompute ? ", precompute_features: true" : "") + "}";
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
  torch::NoGradGuard no_grad;
  if (projection_norm > 0) {  // rows projection_norm e_i: a key along e_i raises feature i by ~norm^2 / 2
    kernel->named_buffers()["projection"].copy_(projection_norm * torch::eye(kDim).repeat({features / kDim, 1}));
  }
  torch::manual_seed(6);
  for (auto& p : kernel->parameters()) p.add_(0.1 * torch::randn_like(p));  // darkformer: M per head
  return kernel;
}

struct Inputs {
  torch::Tensor q, k, v, weights;
};

// pattern "ordinary": N(0, 1); "sharp": queries near u, keys near -u, rows of norm 60; "jump": keys
// 11 (inside the sub-chunk [8, 16)) and 32 (a chunk's first) along e_1 and e_5 with projections
// of norm 30, queries leaning towards them.
inline Inputs MakeInputs(const std::string& pattern) {
  torch::manual_seed(53);
  const double root = std::pow(static_cast<double>(kDim), 0.25);  // the kernels see x = q / d^(1/4)
  Inputs in;
  in.q = torch::randn({1, kHeads, kLength, kDim});
  in.k = torch::randn({1, kKvHeads, kLength, kDim});
  in.v = torch::randn({1, kKvHeads, kLength, kDim});
  in.weights = torch::randn({1, kHeads, kLength, kDim}).to(torch::kBFloat16).to(torch::kFloat32);
  if (pattern == "sharp") {
    const auto u = torch::randn({kDim});
    const auto unit = u / u.norm();
    in.q = 60.0 * torch::nn::functional::normalize(unit + 0.1 * in.q, torch::nn::functional::NormalizeFuncOptions().dim(-1));
    in.k = 60.0 * torch::nn::functional::normalize(-unit + 0.1 * in.k, torch::nn::functional::NormalizeFuncOptions().dim(-1));
  } else if (pattern == "jump") {
    in.q = 0.5 * root * in.q;
    in.q.select(3, 1).add_(2.0 * root);
    in.q.select(3, 5).add_(2.0 * root);
    in.k = 0.3 * root * in.k;
    in.k[0][0][11].zero_()[1] = 30.0 * root;
    in.k[0][0][32].zero_()[5] = 30.0 * root;
  }
  return in;
}

struct Result {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // q, k, v, then the kernel's parameters
};

// bf16: the inputs rounded to bf16, and given so to the kernel unless it computes in fp64 (the
// reference then takes the rounded values); op: cuda then runs its products on tensor cores.
inline Result RunKernel(AttentionKernel& kernel, const Inputs& in, torch::Device device, torch::ScalarType compute,
           const torch::Tensor& document_ids_BL = {}, bool bf16 = false) {
  kernel->to(device, compute);
  auto leaf = [&](const torch::Tensor& t) {
    const auto x = bf16 ? t.to(torch::kBFloat16) : t;
    return x.to(device, bf16 && compute != torch::kFloat64 ? torch::kBFloat16 : compute).detach().clone().requires_grad_();
  };
  auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  if (document_ids_BL.defined()) call.document_ids_BL = document_ids_BL.to(device);  // read where they live
  const auto out = kernel->forward(q, k, v, call);
  (out.to(torch::kFloat64) * in.weights.to(device, torch::kFloat64)).sum().backward();
  Result r{out.detach().cpu(), {q.grad().cpu(), k.grad().cpu(), v.grad().cpu()}};
  for (auto& p : kernel->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().cpu() : torch::Tensor());
  return r;
}

inline double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const auto b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(1e-300)).item<double>();
}

// The rule of extreme_scale_test.cpp: relative 1e-4 (outputs) and 1e-3 (gradients) up to |x| = 30;
// beyond, fp32's rounding of the exponents' arguments A 2^-24 (A = the largest |log phi|) bounds
// what any fp32 form can reach: max(1e-4, 4 A 2^-24) and 10x that. bf16 inputs: the shared bf16
// rule of device_forms_test.cpp on top, at least 2^-8 for what is stored in bf16 (the output and
// the inputs' gradients; the parameters' stay fp32).
inline void ExpectMatches(const std::string& name, const std::string& pattern, double max_log_feature,
                   const torch::Tensor& document_ids_BL = {}, bool bf16 = false, int64_t chunk = kChunk,
                   int64_t features = kFeatures, const std::string& op = "cuda", int64_t sub_chunk = 0,
                   const std::string& pairs = "", bool precompute = false) {
  const auto device = testing::TestDevice();
  const double projection_norm = pattern == "jump" ? 30.0 : 0.0;
  const auto in = MakeInputs(pattern);
  auto reference = Make(name, "chunk_loop", projection_norm, kChunk, features);
  const auto ref = RunKernel(reference, in, torch::kCPU, torch::kFloat64, document_ids_BL, bf16);
  auto kernel = Make(name, op, projection_norm, chunk, features, kHeads, sub_chunk, 0, pairs, precompute);
  const auto got = RunKernel(kernel, in, device, torch::kFloat32, document_ids_BL, bf16);
  const double out_tol = std::max(1e-4, 4 * max_log_feature * std::ldexp(1.0, -24));
  const double storage = bf16 ? std::ldexp(1.0, -8) : 0.0;
  const std::string where = name + " " + op + " " + pattern + " on " + device.str() + (bf16 ? " bf16" : "") +
                            " chunk " + std::to_string(chunk) + " sub_chunk " + std::to_string(sub_chunk) +
                            (pairs.empty() ? "" : " pairs " + pairs) + (precompute ? " precomputed features" : "");
  ASSERT_TRUE(torch::isfinite(got.out).all().item<bool>()) << where;
  EXPECT_LE(RelativeError(got.out, ref.out), std::max(out_tol, storage)) << where << " output";
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << where;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    if (!ref.grads[i].defined()) continue;
    ASSERT_TRUE(torch::isfinite(got.grads[i]).all().item<bool>()) << where << " grad " << i;
    EXPECT_LE(RelativeError(got.grads[i], ref.grads[i]), std::max(10 * out_tol, i < 3 ? storage : 0.0))
        << where << " grad " << i;
  }
}

// Two packed documents, the second from position 12 (inside a sub-chunk): ids 1 x kLength.
inline torch::Tensor TwoDocuments() {
  const auto ids = torch::tensor(std::vector<int64_t>(kLength, 0)).view({1, kLength});
  ids.narrow(1, 12, kLength - 12).add_(1);
  return ids;
}

// Two runs' outputs and every gradient the same to the bit.
inline void ExpectSameBits(const Result& first, const Result& second, const std::string& where) {
  EXPECT_TRUE(torch::equal(first.out, second.out)) << where << " output";
  ASSERT_EQ(first.grads.size(), second.grads.size()) << where;
  for (size_t i = 0; i < first.grads.size(); ++i) {
    if (first.grads[i].defined()) EXPECT_TRUE(torch::equal(first.grads[i], second.grads[i])) << where << " grad " << i;
  }
}

// As if `blocks` blocks of the per-chunk kernels ran at once (LimitCudaOpBlocksForTesting) for the
// scope's life: each row's segments (cuda_op_launch::SegmentChunks) take ceil(blocks / rows) chunks.
struct ResidentBlocksScope {
  explicit ResidentBlocksScope(int64_t blocks) { LimitCudaOpBlocksForTesting(blocks); }
  ~ResidentBlocksScope() { LimitCudaOpBlocksForTesting(0); }
  ResidentBlocksScope(const ResidentBlocksScope&) = delete;
  ResidentBlocksScope& operator=(const ResidentBlocksScope&) = delete;
};

// As if the device's shared memory could not hold a block's scratch (AllowCudaOpSharedScratchForTesting)
// for the scope's life: the per-chunk kernels keep it in global memory, as for performer at Gemma
// 2B's shape (230 KiB a block).
struct GlobalScratchScope {
  GlobalScratchScope() { AllowCudaOpSharedScratchForTesting(false); }
  ~GlobalScratchScope() { AllowCudaOpSharedScratchForTesting(true); }
};

}  // namespace darkformer::cuda_op_cases
