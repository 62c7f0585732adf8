// The running key state's fold (see state_fold.h).
#include "attention/ops/state_fold.h"

#include "attention/ops/dtype_probe.h"

namespace darkformer::causal_ops {

void KeyState::Fold(const torch::Tensor& k_XCM, const torch::Tensor& b_XC, const torch::Tensor& vh_XCV,
                    const torch::Tensor& new_ref_X) {
  auto scale = [](const torch::Tensor& log) { return torch::exp(log); };
  // The key weights go on [v, 1] (C x V) rather than on k (C x M).
  const auto vw_XCV = vh_XCV * scale(b_XC - new_ref_X.unsqueeze(-1)).unsqueeze(-1);
  const auto chunk_XMV = torch::matmul(k_XCM.transpose(-1, -2), vw_XCV);
  const auto rescale_X11 = [&] { return scale(ref_X - new_ref_X).unsqueeze(-1).unsqueeze(-1); };
  if (s_XMV.defined() && (s_XMV.requires_grad() || chunk_XMV.requires_grad())) {
    s_XMV = s_XMV * rescale_X11() + chunk_XMV;  // recorded by autograd: no in-place update
  } else if (s_XMV.defined()) {
    s_XMV.mul_(rescale_X11()).add_(chunk_XMV);
  } else {
    s_XMV = chunk_XMV;
  }
  ref_X = new_ref_X;
  RecordDtype(ProbeField::kState, s_XMV);
}

}  // namespace darkformer::causal_ops
