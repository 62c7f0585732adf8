// fp32-accurate products where CUDA would take TF32 operands (see fp32_products.h).
#include "attention/ops/fp32_products.h"

#include <ATen/Context.h>

namespace darkformer {

namespace {

// TF32 keeps 10 of fp32's 23 mantissa bits: the low 13 go. Adding half of the last kept bit to the
// magnitude's bits rounds half away from zero (a carry into the exponent is the right rounding);
// an input within 2^-11 of fp32's largest finite value would round to inf, but its |x|^2 / 2 in the
// features is inf already.
constexpr int32_t kDroppedBits = 13;
constexpr int32_t kHalfDropped = int32_t{1} << (kDroppedBits - 1);
constexpr int32_t kKeptMask = ~((int32_t{1} << kDroppedBits) - 1);

}  // namespace

bool SplitsForTf32(const torch::Tensor& a, const torch::Tensor& b) {
  return a.is_cuda() && a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32 &&
         at::globalContext().allowTF32CuBLAS();
}

std::pair<torch::Tensor, torch::Tensor> SplitForTf32(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "SplitForTf32 takes fp32, got ", x.scalar_type());
  // hi is a constant of x's values (no gradient); lo = x - hi is exact (Sterbenz: hi is within a
  // factor 2 of x, same sign) and carries x's gradient.
  const auto hi = x.detach().contiguous().view(torch::kInt32).add(kHalfDropped).bitwise_and_(kKeptMask).view(torch::kFloat32);
  return {hi, x - hi};
}

torch::Tensor SplitMatmul(const torch::Tensor& a, const torch::Tensor& b) {
  const auto [a_hi, a_lo] = SplitForTf32(a);
  const auto [b_hi, b_lo] = SplitForTf32(b);
  // The two small terms first, so the large one adds to their sum once.
  return torch::matmul(a_hi, b_lo).add_(torch::matmul(a_lo, b_hi)).add_(torch::matmul(a_hi, b_hi));
}

torch::Tensor Fp32Matmul(const torch::Tensor& a, const torch::Tensor& b) {
  return SplitsForTf32(a, b) ? SplitMatmul(a, b) : torch::matmul(a, b);
}

}  // namespace darkformer
