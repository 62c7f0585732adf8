// The trainer's losses and evaluation (see trainer.h): each micro-batch's loss through the full
// logits or the chunked LM-head cross-entropy, under the run's autocast scope, and the
// validation pass.
#include <spdlog/spdlog.h>

#include "train/trainer.h"
#include "util/labels.h"
#include "util/mixed_precision.h"

namespace darkformer {

EvalResult Trainer::Evaluate(BatchSource& loader, int64_t batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto saved = loader.state();
  double loss_sum = 0.0;
  int64_t correct = 0, tokens = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const auto batch = loader.Next();
    const auto ids = batch.input_ids_BL.to(device_), labels = batch.labels_BL.to(device_);
    AutocastScope autocast(device_.type(), bf16());
    if (config_.train.loss_chunk_tokens > 0) {  // no full logits in evaluation either
      const auto sums = model_->EvalChunked(ids, labels, config_.train.loss_chunk_tokens);
      loss_sum += sums.loss_sum;
      correct += sums.correct;
      tokens += sums.count;
      continue;
    }
    const auto logits = model_->forward(ids).to(torch::kFloat32);
    const auto mask = labels.ne(kIgnoreIndex);
    const int64_t n = mask.sum().item<int64_t>();
    if (n == 0) continue;
    loss_sum += CausalLmLoss(logits, labels).item<double>() * static_cast<double>(n);
    correct += (logits.argmax(-1).eq(labels) & mask).sum().item<int64_t>();
    tokens += n;
  }
  loader.Restore(saved);  // every eval sees the same validation batches
  model_->train();
  if (parallel_) {  // each rank evaluated its slice of every batch
    const auto totals = parallel_->Sum({loss_sum, static_cast<double>(correct), static_cast<double>(tokens)},
                                       "summing evaluation results");
    loss_sum = totals[0];
    correct = static_cast<int64_t>(totals[1]);
    tokens = static_cast<int64_t>(totals[2]);
  }
  EvalResult r;
  r.tokens = tokens;
  r.loss = tokens ? loss_sum / static_cast<double>(tokens) : 0.0;
  r.perplexity = std::exp(r.loss);
  r.accuracy = tokens ? static_cast<double>(correct) / static_cast<double>(tokens) : 0.0;
  return r;
}

EvalResult Trainer::EvaluateFrom(BatchSource& loader, int64_t batches) {
  BuildModel();
  CheckVocabulary(loader);
  ApplyDocumentMasking(loader);
  return Evaluate(loader, batches);
}

// As torch's zero_grad(set_to_none=True), except that under data parallelism a gradient that is a
// view into the reducer's bucket (gradient_as_bucket_view) is zeroed in place: it cannot be
// detached, and keeping it keeps the next backward accumulating into the bucket (one copy).
void Trainer::ZeroGradients() {
  if (!parallel_) {
    optimizer_->zero_grad(/*set_to_none=*/true);
    return;
  }
  for (auto& p : trainable_) {
    auto& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (grad.is_view()) {
      grad.zero_();
    } else {
      grad.reset();
    }
  }
}

// The micro-batch's mean token loss: the full-logit loss, or the chunked one (train.loss_chunk_tokens).
torch::Tensor Trainer::MeanLoss(const torch::Tensor& ids, const torch::Tensor& labels) {
  if (config_.train.loss_chunk_tokens <= 0) return CausalLmLoss(model_->forward(ids), labels);
  const double count = static_cast<double>(labels.ne(kIgnoreIndex).sum().item<int64_t>());
  return model_->LossSum(ids, labels, config_.train.loss_chunk_tokens) / count;
}

torch::Tensor Trainer::LossSum(const torch::Tensor& ids, const torch::Tensor& labels) {
  if (config_.train.loss_chunk_tokens > 0) return model_->LossSum(ids, labels, config_.train.loss_chunk_tokens);
  const auto logits = model_->forward(ids);
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

}  // namespace darkformer
