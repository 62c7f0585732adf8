// The trainable set and what follows from it (see trainable_set.h).
#include "train/trainable_set.h"

#include <fnmatch.h>

#include "model/linear_weights.h"
#include "train/fused_adamw.h"
#include "util/error.h"

namespace darkformer {

bool MatchesAny(const std::string& name, const std::vector<std::string>& globs) {
  for (const auto& glob : globs) {
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

TrainableSet FreezeByGlobs(GemmaModelImpl& model, const std::vector<std::string>& trainable_globs) {
  TrainableSet set;
  for (const auto& item : model.named_parameters()) {
    auto param = item.value();
    const bool train = MatchesAny(item.key(), trainable_globs);
    param.set_requires_grad(train);
    (train ? set.trainable : set.frozen) += param.numel();
    if (train) set.parameters.push_back(param);
  }
  DF_CHECK(!set.parameters.empty(), "config key 'train.trainable' matches no parameter");
  return set;
}

int64_t StoreFrozenLinearWeightsInBf16(GemmaModelImpl& model) {
  torch::NoGradGuard no_grad;
  int64_t converted = 0;
  for (auto& item : model.named_parameters()) {
    auto param = item.value();
    if (param.requires_grad() || !IsLinearWeight(item.key()) || param.scalar_type() != torch::kFloat32) continue;
    param.set_data(param.to(torch::kBFloat16));
    converted += param.numel();
  }
  return converted;
}

std::unique_ptr<torch::optim::AdamW> MakeAdamW(GemmaModelImpl& model, const TrainConfig& t) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;  // frozen: no optimizer state at all
    (MatchesAny(item.key(), t.no_decay) ? no_decay : decay).push_back(item.value());
  }
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, options(t.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<FusedAdamW>(groups, torch::optim::AdamWOptions(t.lr));
}

}  // namespace darkformer
