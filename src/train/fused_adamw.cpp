// AdamW through LibTorch's fused kernel (see fused_adamw.h).
#include "train/fused_adamw.h"

#include <map>
#include <memory>
#include <string>
#include <utility>

namespace darkformer {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "FusedAdamW: amsgrad is not supported");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    // One step tensor per count and device, shared by the parameters at that count (the kernel
    // only reads it): one fill per group a step, not one per parameter.
    std::map<std::pair<int64_t, std::string>, torch::Tensor> step_tensors;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {  // the first step: zero moments, as torch::optim::AdamW starts them
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      // The kernel reads the step count (the bias corrections) where the parameter lies, and does
      // not advance it: the count of record is the state's integer.
      auto& step = step_tensors[{state.step(), p.device().str()}];
      if (!step.defined()) step = torch::full({}, static_cast<double>(state.step()), p.options().dtype(torch::kFloat32));
      steps.push_back(step);
    }
    if (params.empty()) continue;
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(), beta1, beta2,
                      o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
  }
  return loss;
}

}  // namespace darkformer
