// The trainer's losses and evaluation (see trainer.h): the step's micro-batches, each one's forward
// and backward (through the replica group), through the full logits or the chunked LM-head
// cross-entropy, and the validation pass.
#include <spdlog/spdlog.h>

#include <vector>

#include "train/trainer.h"
#include "util/labels.h"
#include "util/mixed_precision.h"

namespace darkformer {
namespace {

// A batch onto the device. To a GPU through pinned memory, asynchronously: a copy from pageable
// memory makes the host wait for the stream, so reading a step's batches would stall on the
// previous step's work.
torch::Tensor ToDevice(const torch::Tensor& t, torch::Device device) {
  if (!device.is_cuda()) return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

EvalResult Trainer::Evaluate(BatchSource& loader, int64_t batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto saved = loader.state();
  // {loss sum, correct, labelled tokens} in fp64 on the device, added batch after batch as the host
  // added them before: the evaluation reads them back once, at its end.
  auto sums = torch::zeros({3}, torch::TensorOptions().device(device_).dtype(torch::kFloat64));
  for (int64_t b = 0; b < batches; ++b) {
    const auto batch = loader.Next();
    const auto ids = ToDevice(batch.input_ids_BL, device_), labels = ToDevice(batch.labels_BL, device_);
    AutocastScope autocast(device_.type(), bf16());
    if (config_.train.loss_chunk_tokens > 0) {  // no full logits in evaluation either
      sums.add_(model_->EvalChunked(ids, labels, config_.train.loss_chunk_tokens));
      continue;
    }
    const auto logits = model_->forward(ids).to(torch::kFloat32);
    const auto mask = labels.ne(kIgnoreIndex);
    const auto n = mask.sum().to(torch::kFloat64);
    // The batch's mean loss times its labelled tokens; a batch without labels adds nothing (its mean
    // is 0/0).
    const auto loss_sum = torch::where(n > 0, CausalLmLoss(logits, labels).to(torch::kFloat64) * n, 0.0);
    const auto correct = (logits.argmax(-1).eq(labels) & mask).sum().to(torch::kFloat64);
    sums.add_(torch::stack({loss_sum, correct, n}));
  }
  const auto read = sums.cpu();
  double loss_sum = read[0].item<double>();
  int64_t correct = static_cast<int64_t>(read[1].item<double>()), tokens = static_cast<int64_t>(read[2].item<double>());
  loader.Restore(saved);  // every eval sees the same validation batches
  model_->train();
  // Each rank evaluated its slice of every batch.
  const auto totals = replicas_->Sum({loss_sum, static_cast<double>(correct), static_cast<double>(tokens)},
                                     "summing evaluation results");
  loss_sum = totals[0];
  correct = static_cast<int64_t>(totals[1]);
  tokens = static_cast<int64_t>(totals[2]);
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

std::vector<Trainer::MicroBatch> Trainer::ReadMicroBatches() {
  std::vector<MicroBatch> micro_batches;
  std::vector<double> label_counts;
  for (int64_t i = 0; i < config_.train.grad_accum; ++i) {
    const auto batch = train_loader_->Next();
    micro_batches.push_back({ToDevice(batch.input_ids_BL, device_), ToDevice(batch.labels_BL, device_), 0.0});
    label_counts.push_back(static_cast<double>(batch.labels_BL.ne(kIgnoreIndex).sum().item<int64_t>()));
  }
  // One all-reduce before any forward gives every micro-batch's global count.
  label_counts = replicas_->Sum(label_counts, "summing label counts");
  for (size_t i = 0; i < micro_batches.size(); ++i) micro_batches[i].label_count = label_counts[i];
  return micro_batches;
}

torch::Tensor Trainer::MicroBatchBackward(const MicroBatch& batch, bool last_micro, int64_t step) {
  torch::Tensor loss;
  {
    // Autocast covers this micro-batch's forward and loss only: leaving the scope drops its
    // cached bf16 weights, so no cast outlives the optimizer step (mixed_precision.h).
    AutocastScope autocast(device_.type(), bf16());
    loss = LossSum(batch.ids, batch.labels) / batch.label_count / static_cast<double>(config_.train.grad_accum);
  }
  loss = faults_->Loss(loss, step);
  replicas_->Backward(loss, last_micro);
  return loss.detach();
}

// The micro-batch's token loss sum: through the full logits, or the chunked LM-head loss
// (train.loss_chunk_tokens), which never forms them.
torch::Tensor Trainer::LossSum(const torch::Tensor& ids, const torch::Tensor& labels) {
  if (config_.train.loss_chunk_tokens > 0) return model_->LossSum(ids, labels, config_.train.loss_chunk_tokens);
  const auto logits = model_->forward(ids);
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

}  // namespace darkformer
