// Which parameters a run trains, and what follows from it, declared once: train.trainable globs
// freeze the rest (q/k/v-only finetuning), frozen Linear weights may be stored in bf16, and the
// optimizer holds the trainable ones only, in a decay and a no-decay group (train.no_decay).
// The trainer and the memory estimate both ask here.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "model/gemma_model.h"
#include "train/train_config.h"

namespace darkformer {

// Whether `name` matches any glob (fnmatch, '*' also crosses dots).
bool MatchesAny(const std::string& name, const std::vector<std::string>& globs);

struct TrainableSet {
  std::vector<torch::Tensor> parameters;  // requires_grad, in the model's order
  int64_t trainable = 0, frozen = 0;      // elements
};

// Sets requires_grad by train.trainable; refuses a glob list that matches nothing, naming the key.
TrainableSet FreezeByGlobs(GemmaModelImpl& model, const std::vector<std::string>& trainable_globs);

// train.frozen_weights_bf16: frozen projection and MLP weights in bf16. Under autocast their GEMMs
// run in bf16 anyway, so only the storage changes (and no per-use cast is made). The embedding
// (also the LM head), norms and kernel parameters keep fp32. Returns the elements converted.
int64_t StoreFrozenLinearWeightsInBf16(GemmaModelImpl& model);

// AdamW over the trainable parameters, fused (fused_adamw.h): weight decay except those matching
// train.no_decay.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(GemmaModelImpl& model, const TrainConfig& t);

}  // namespace darkformer
