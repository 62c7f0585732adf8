// fp32's accuracy for LibTorch's products where a run's TF32 (train.tf32, on by default for CUDA
// runs) would round their operands: random-feature attention's products feed a feature's exponent
// (log phi = W x - |x|^2 / 2, x = M q), where an error is scaled by the features' magnitude, or
// cancel (the backward's g . v_j against g . out on sharp rows; signed features' normaliser).
//
// Two ways, by where the product runs:
// - Fp32Matmul: fp32 operands on CUDA with TF32 allowed split into x = hi + lo, hi with TF32's 10
//   mantissa bits (exact on tensor cores), lo = x - hi exact in fp32, |lo| <= 2^-11 |x| (x normal;
//   a subnormal's lo is below 2^-137); a b = hi_a hi_b + hi_a lo_b + lo_a hi_b, the dropped
//   lo_a lo_b at most 2^-22 |a||b| per term. A tensor core takes hi_a hi_b exactly and rounds or
//   truncates lo (relative 2^-10 at worst: 2^-21 |x|), so each term lands within 2^-21 + 2^-21 +
//   2^-22 < 2^-19.6 of |a_k b_k|, against 2^-10 for one TF32 product: for log-features of 100
//   (Gemma-scale queries) 0.1 in the exponent, a 10 % error in a feature, where the split keeps
//   2e-4 %. Three TF32 products, still on tensor cores (3xTF32, as op: cuda's own,
//   cuda_scan_matmul.h); elsewhere (the CPU, fp64, TF32 off) the plain product. Under autograd on
//   CUDA it is a node whose backward splits its two products the same way (TrackedFp32Matmul).
//   For the paths autograd differentiates (the composite form, signed features' linear
//   attention and its decoding).
// - NoTf32Scope: TF32 off in a scope, for the operator's forms, forward, custom backward, prefill
//   and recurrent steps: the
//   chunk forms' ~25 products would each take ten more launches split, and op: cuda's LibTorch
//   products (its scan splits its own: 3xTF32 or bf16x3) would hold four more L x D tensors at once. Plain
//   TF32 missed the bf16 rule by 6-25x in the backward's cancelling products (op: cuda's first
//   build on an H200).
#pragma once

#include <torch/torch.h>

#include <utility>

namespace darkformer {

// torch::matmul(a, b) at fp32's accuracy wherever LibTorch would take TF32 operands.
torch::Tensor Fp32Matmul(const torch::Tensor& a, const torch::Tensor& b);

// The autograd node Fp32Matmul takes on CUDA, on any device (matrices or batches of them; batch
// dimensions broadcast, their gradients summed back).
torch::Tensor TrackedFp32Matmul(const torch::Tensor& a, const torch::Tensor& b);

// LibTorch's CUDA products in full fp32 in its scope (TF32 off for cuBLAS and cuDNN); the setting
// before comes back at its end. The setting is the process's: a product on another thread meanwhile
// runs in fp32 too.
class NoTf32Scope {
 public:
  NoTf32Scope();
  ~NoTf32Scope();
  NoTf32Scope(const NoTf32Scope&) = delete;
  NoTf32Scope& operator=(const NoTf32Scope&) = delete;

 private:
  bool cublas_, cudnn_;
};

// Whether Fp32Matmul splits a b: fp32 operands on CUDA with TF32 allowed for cuBLAS.
bool SplitsForTf32(const torch::Tensor& a, const torch::Tensor& b);

// x (fp32) = hi + lo: hi rounded to TF32's 10 mantissa bits (its 13 low bits 0), lo = x - hi.
// Exposed for the tests, as is the three-product sum on any device.
std::pair<torch::Tensor, torch::Tensor> SplitForTf32(const torch::Tensor& x);
torch::Tensor SplitMatmul(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace darkformer
