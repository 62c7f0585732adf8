// fp32-accurate products where CUDA would take TF32 operands (see fp32_products.h).
#include "attention/ops/fp32_products.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>

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

namespace {

torch::Tensor UntrackedProduct(const torch::Tensor& a, const torch::Tensor& b) {
  return SplitsForTf32(a, b) ? SplitMatmul(a, b) : torch::matmul(a, b);
}

// a b for autograd with a backward of the same accuracy: dA = g B^T and dB = A^T g are products
// too, each split where TF32 is on when the backward runs (which may differ from the forward's
// setting: a chunk form's forward turns TF32 off, its inputs' autograd backward runs outside).
// The gradients of broadcast batch dimensions are summed back to the operand's shape.
class Fp32MatmulFunction : public torch::autograd::Function<Fp32MatmulFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    ctx->save_for_backward({a, b});
    return UntrackedProduct(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &b = saved[1], &g = grad_outputs[0];
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = at::sum_to(UntrackedProduct(g, b.transpose(-1, -2)), a.sizes());
    if (ctx->needs_input_grad(1)) db = at::sum_to(UntrackedProduct(a.transpose(-1, -2), g), b.sizes());
    return {da, db};
  }
};

}  // namespace

torch::Tensor TrackedFp32Matmul(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2, "TrackedFp32Matmul takes matrices (or batches of them), got ", a.sizes(),
              " and ", b.sizes());
  return Fp32MatmulFunction::apply(a, b);
}

torch::Tensor Fp32Matmul(const torch::Tensor& a, const torch::Tensor& b) {
  const bool tracked = torch::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
  const bool cuda_fp32 = a.is_cuda() && a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32;
  if (tracked && cuda_fp32 && a.dim() >= 2 && b.dim() >= 2) return TrackedFp32Matmul(a, b);
  return UntrackedProduct(a, b);
}

NoTf32Scope::NoTf32Scope()
    : cublas_(at::globalContext().allowTF32CuBLAS()), cudnn_(at::globalContext().allowTF32CuDNN()) {
  if (cublas_) at::globalContext().setAllowTF32CuBLAS(false);
  if (cudnn_) at::globalContext().setAllowTF32CuDNN(false);
}

NoTf32Scope::~NoTf32Scope() {
  if (cublas_) at::globalContext().setAllowTF32CuBLAS(true);
  if (cudnn_) at::globalContext().setAllowTF32CuDNN(true);
}

}  // namespace darkformer
