// Matrix products whose result enters a feature's exponent (log phi = W x - |x|^2 / 2, x = M q):
// there an error is scaled by the features' magnitude, so they keep fp32's accuracy even where
// LibTorch's CUDA products take TF32 operands (train.tf32, on by default for CUDA runs).
//
// Where they would (fp32 operands on CUDA, TF32 allowed), each operand splits into x = hi + lo:
// hi keeps TF32's 10 mantissa bits (exact on tensor cores), lo = x - hi is exact in fp32 with
// |lo| <= 2^-11 |x| (x normal; a subnormal's lo is below 2^-137); then a b = hi_a hi_b + hi_a lo_b + lo_a hi_b, the dropped lo_a lo_b at most
// 2^-22 |a||b| per term: three TF32 products, still on tensor cores (3xTF32, as the CUDA
// operator's own products, cuda_scan_matmul.h). A tensor core takes hi_a hi_b exactly and rounds
// or truncates lo to TF32 (relative 2^-10 at worst, 2^-21 |x|), so each term a_k b_k lands within
// 2^-21 + 2^-21 + 2^-22 < 2^-19.6 of |a_k b_k|, against 2^-10 of it for one TF32 product:
// for log-features of magnitude 100 (Gemma-scale queries) that is 0.1 in the exponent, 10 % in a
// feature, where the split keeps 2e-4 %. Elsewhere (the CPU, fp64, TF32 off) one plain product.
//
// Under autograd on CUDA the product is a node of its own whose backward's two products split
// the same way when TF32 is on as it runs (TrackedFp32Matmul); the closed-form backwards
// (feature_gradients.h) run outside autograd and take Fp32Matmul for their own products.
//
// The chunk forms' other products (states, pairs, values, and the backward's, where g . v_j and
// g . out cancel on sharp rows) run with TF32 off altogether (NoTf32Scope): plain TF32 missed the
// bf16 rule there by 6-25x in the CUDA operator (cuda_scan_matmul.h), and splitting each of them
// would add ten launches per product to forms of a fixed op count. The paths autograd
// differentiates (the composite form, signed features' linear attention) take Fp32Matmul for
// every product instead: a scope cannot reach their backward, the node's own backward does.
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
