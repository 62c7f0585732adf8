// What the causal operators (ops/*) see of a kernel: its feature map in log form, and which of
// the operator's forms computes the attention. fla keeps the same split: modules/feature_map.py
// (the map) against ops/linear_attn/* (the forms).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace darkformer {

// The forms of causal linear attention with log-form features. Every form gives the numbers of
// the naive reference (causal_linear_attention.h, which the kernels run for `op: naive`).
enum class CausalOp {
  kAuto,           // what the device runs (causal_form.h): raw_cpu where it applies, chunk_loop elsewhere on a CPU
                   // (chunk_parallel for packed documents, data.document_masking), chunk_parallel on CUDA
  kNaive,          // the whole-sequence composite reference: the kernel runs it, the operators refuse it
  kChunkLoop,      // LibTorch ops chunk by chunk (ops/chunk_loop.cpp): ~32 ops per chunk forward
  kChunkParallel,  // LibTorch ops over all chunks at once (ops/chunk_parallel.cpp): op count independent of L
  kRawCpu,         // the raw fp32 AVX2 kernel (raw_cpu_kernel.h): positive features on a CPU only
  kCuda,           // the CUDA operator (cuda_op.h): a CUDA device only
};

// The forms' names, in the enum's order: "auto", "naive", "chunk_loop", "chunk_parallel", "raw_cpu",
// "cuda" (declared once, in feature_map.cpp: the config key's choices and kernel-check's --op
// derive from it).
const std::vector<std::string>& CausalOpNames();
// One of CausalOpNames(); anything else throws naming `key_path`.
CausalOp ParseCausalOp(const std::string& name, const std::string& key_path);
std::string CausalOpName(CausalOp op);

// A kernel's feature map as the operators see it: log phi of a block of inputs, differentiable
// w.r.t. the inputs and `params` (the kernel's gradient path: M, W, ...).
struct FeatureMap {
  // x_BNCD (N heads: H for queries; K or H for keys) -> log phi_BNCM in fp32 / fp64. `params` are
  // the tensors of `params` below (or leaf copies of them during the backward). It must return a
  // fresh tensor: outside autograd the operators shift and exponentiate it in place.
  std::function<torch::Tensor(const torch::Tensor& x_BNCD, const std::vector<torch::Tensor>& params, bool is_query)>
      log_features;
  std::vector<torch::Tensor> params;
  // True when key features depend on the query head (parameters per query head), so they are
  // computed for each of the G query heads that share a KV head.
  bool keys_per_query_head = false;
  // params_per_head[i]: params[i]'s first dimension indexes the query heads; missing entries mean shared.
  std::vector<bool> params_per_head;
  // Set when log_features is exactly LogPositiveFeatures(x, params[0]) (positive_features.h:
  // log phi = x W^T - |x|^2/2 - log(m)/2, W shared m x D). The backward then differentiates the
  // features in closed form,
  //   d log phi = dphi * phi,   dx = (d log phi) W - x sum_m (d log phi),   dW = (d log phi)^T x,
  // with no autograd graph (other maps recompute their features under autograd).
  bool positive_features = false;
  // Positive features of inputs mapped linearly first (LogFeatureKernel's PositiveFeatureForm):
  // with input_map, params[1] is A (1 x N x D x R; N = H: per query head, keys then per query head;
  // N = 1: shared) and the features read x A and y A; without it they read input_scale x and
  // input_scale y. op: cuda maps inside and again in its backward, so autograd keeps the inputs as
  // given (no fp32 copy, no copy per query head); FusedCausalLinearAttention maps them up front,
  // under autograd, for the other forms.
  bool input_map = false;
  double input_scale = 1.0;
  CausalOp op = CausalOp::kAuto;
  // op: cuda's longest sub-chunk (FeatureKernelOptions::sub_chunk; 0: its default).
  int64_t sub_chunk = 0;
  // op: cuda's chunks per segment (FeatureKernelOptions::segment_chunks; 0: its default).
  int64_t segment_chunks = 0;
  // op: cuda's pairs pair by pair throughout (FeatureKernelOptions::exponential_pairs).
  bool exponential_pairs = false;
  // op: cuda's log-features by one LibTorch product before each pass, not inside its launches
  // (FeatureKernelOptions::precompute_features).
  bool precompute_features = false;
  // m, the features per head (0: not said).
  int64_t num_features = 0;
  // The dtype the caller's queries arrived in, before the features' fp32: a 16-bit one (what users
  // train in) lets op: cuda take its matrix products on TF32 tensor cores (cuda_scan_matmul.h).
  torch::ScalarType input_dtype = torch::kFloat32;
};

// The map saved with an autograd node, for its backward (the caller's copy is gone by then).
void SaveFeatureMap(torch::autograd::AutogradContext* ctx, const FeatureMap& map);
// What SaveFeatureMap saved; it lives as long as the node.
const FeatureMap& SavedFeatureMap(torch::autograd::AutogradContext* ctx);

}  // namespace darkformer
