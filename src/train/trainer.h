// The training loop: builds the model (from scratch, converted HF weights or our checkpoint, with
// a possibly different attention kernel), freezes by name globs, runs AdamW with a schedule,
// clipping and accumulation, logs JSONL metrics and spikes, evaluates, checkpoints and resumes.
#pragma once

#include <atomic>
#include <fstream>
#include <memory>
#include <string>

#include "data/packed_loader.h"
#include "model/gemma_model.h"
#include "train/attention_stats.h"
#include "train/checkpoint.h"
#include "train/run_config.h"
#include "train/spike_monitor.h"

namespace darkformer {

struct EvalResult {
  double loss = 0.0;
  double perplexity = 0.0;
  double accuracy = 0.0;  // next-token accuracy over non-ignored labels (the paper's metric)
  int64_t tokens = 0;
};

// Set by SIGINT/SIGTERM; the trainer finishes the step, checkpoints and exits non-zero.
extern std::atomic<bool> g_stop_requested;
void InstallStopSignalHandlers();

// Exit codes of Trainer::Run.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitDiverged = 3;

// Whether `name` matches any glob (fnmatch, '*' also crosses dots).
bool MatchesAny(const std::string& name, const std::vector<std::string>& globs);

class Trainer {
 public:
  explicit Trainer(RunConfig config);
  int Run();
  EvalResult Evaluate(PackedLoader& loader, int64_t batches);
  // Builds the model from train.init_from and evaluates it (the eval command).
  EvalResult EvaluateFrom(PackedLoader& loader, int64_t batches);

  GemmaModel model() const { return model_; }
  const TrainerState& state() const { return state_; }
  // After Run(): the optimizer (its param groups hold the trainable parameters only).
  torch::optim::AdamW& optimizer() const { return *optimizer_; }

 private:
  void BuildModel();
  void BuildOptimizer();
  void CalibrateWhiteningKernels();
  void ApplyLr(double lr);
  void WriteCheckpoint();
  void LogStep(double loss, double grad_norm, double lr, double step_ms, int64_t tokens, const SpikeVerdict& v,
               bool skipped, const std::vector<LayerAttentionStats>& attention);
  void WriteNonfinite(int64_t step, double loss, double grad_norm, const LoaderState& position);
  void LogEval(const EvalResult& r);
  void WriteSummary(bool diverged, double mean_tokens_per_s);

  RunConfig config_;
  torch::Device device_{torch::kCPU};
  GemmaModel model_{nullptr};
  std::vector<torch::Tensor> trainable_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<PackedLoader> train_loader_;
  std::unique_ptr<PackedLoader> val_loader_;
  std::unique_ptr<SpikeMonitor> spikes_;
  TrainerState state_;
  std::string attention_yaml_;
  std::ofstream metrics_, spike_log_;
  double last_eval_loss_ = 0.0;
};

}  // namespace darkformer
