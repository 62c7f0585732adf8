// The training loop: builds the model (from scratch, converted HF weights or our checkpoint, with
// a possibly different attention kernel), freezes by name globs, runs AdamW with a schedule,
// clipping and accumulation, logs JSONL metrics and spikes, evaluates, checkpoints and resumes.
// Run() reads as torchtitan's train(): set up, resume, then step / log / evaluate / checkpoint.
// Started by torchrun with WORLD_SIZE > 1 it is one data-parallel rank: it reads its slice of each
// global batch, gradients are averaged over ranks, every decision (skip, stop, spike) is taken on
// all-reduced values, and rank 0 alone writes the run directory. The loop does not branch on it:
// a plain run is a group of one (distributed/replica_group.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "data/batch_source.h"
#include "distributed/replica_group.h"
#include "model/gemma_model.h"
#include "train/attention_stats.h"
#include "train/checkpoint.h"
#include "train/divergence.h"
#include "train/fault_injection.h"
#include "train/run_config.h"
#include "train/run_log.h"
#include "train/spike_monitor.h"
#include "train/step_metrics.h"

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

class Trainer {
 public:
  explicit Trainer(RunConfig config);
  int Run();
  EvalResult Evaluate(BatchSource& loader, int64_t batches);
  // Builds the model from train.init_from and evaluates it (the eval command).
  EvalResult EvaluateFrom(BatchSource& loader, int64_t batches);

  GemmaModel model() const { return model_; }
  const TrainerState& state() const { return state_; }
  // After Run(): the optimizer (its param groups hold the trainable parameters only).
  torch::optim::AdamW& optimizer() const { return *optimizer_; }

 private:
  // What one optimizer step did.
  struct StepResult {
    double loss = 0.0, grad_norm = 0.0, lr = 0.0, step_ms = 0.0;
    int64_t tokens = 0;
    bool finite = true, skipped = false;
    SpikeVerdict verdict;
    std::vector<LayerAttentionStats> attention;  // measured on spikes only
    LoaderState position;                        // where the step's batches started
  };

  // Run()'s phases, in order.
  bool AlreadyFinished() const;
  void Setup();
  void Resume();
  StepResult TrainStep();
  void RecordStep(const StepResult& step);
  // train.spikes.on_divergence (trainer_rewind.cpp): after a recorded step, declares divergence
  // by the rules and rewinds (train/rewind.h) or stops; every rank decides alike.
  enum class AfterDivergence { kGoOn, kRewound, kStop };
  AfterDivergence HandleDivergence(const StepResult& step);
  void Rewind(const Divergence& divergence, const std::pair<int64_t, std::string>& target);
  void MaybeEvaluate();
  void MaybeCheckpoint(bool stop);
  int Finish(int exit_code);

  void BuildModel();
  // data.document_masking: the model masks at the loader's separator (EOS); refused, naming the
  // key, when the shards record none.
  void ApplyDocumentMasking(const BatchSource& loader);
  void CheckVocabulary(const BatchSource& loader) const;
  void CalibrateKernels();
  void ApplyLr(double lr);
  void WriteCheckpoint();
  void WriteNonfinite(const StepResult& step);
  void LogStep(const StepResult& step);
  void LogEval(const EvalResult& r);
  // Joins the data-parallel group torchrun's environment describes (none: a plain run, a group of one).
  void JoinReplicaGroup();
  bool is_rank_zero() const { return replicas_->is_rank_zero(); }
  // The same on every rank: any rank's flag raises it on all.
  bool AnyRank(bool flag, const std::string& what);
  // One micro-batch of the step, on the device, and the count of labelled tokens its loss is
  // divided by: the global micro-batch's (summed over the replicas).
  struct MicroBatch {
    torch::Tensor ids, labels;
    double label_count = 0.0;
  };
  // The step's train.grad_accum micro-batches (trainer_loss.cpp).
  std::vector<MicroBatch> ReadMicroBatches();
  // Forward and backward of one micro-batch, under the run's autocast: its mean token loss over
  // grad_accum, so that the summed gradients are the (global) batch's mean. Returns this rank's
  // share of the logged loss, detached and still on the device: the step reads all its shares
  // back in one copy, so a GPU never waits on the host between micro-batches.
  torch::Tensor MicroBatchBackward(const MicroBatch& batch, bool last_micro, int64_t step);
  // The step's lr: the schedule, a rewind's factor and the fault hook.
  double StepLr(int64_t step) const;
  // Every rank's `text` when some rank's differs from rank 0's (compared by digest), else none.
  std::optional<std::vector<std::string>> DifferingRanks(const std::string& text, const std::string& what);
  // Before rank 0's parameters are broadcast: the same names, dtypes and shapes on every rank.
  void CheckRanksBuiltTheSameModel();
  // The replicas average the trainable parameters' gradients from now on (trainer_replicas.cpp).
  void WatchTrainableGradients();
  // The token loss sum of one micro-batch under the caller's autocast scope.
  torch::Tensor LossSum(const torch::Tensor& ids, const torch::Tensor& labels);
  bool bf16() const { return config_.train.precision == Precision::kBf16Autocast; }

  RunConfig config_;
  torch::Device device_{torch::kCPU};
  GemmaModel model_{nullptr};
  std::vector<torch::Tensor> trainable_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<BatchSource> train_loader_;
  std::unique_ptr<BatchSource> val_loader_;  // null without a validation split
  std::unique_ptr<SpikeMonitor> spikes_;
  std::unique_ptr<DivergenceDetector> divergence_;
  std::unique_ptr<RunLog> log_;  // rank 0 only
  std::unique_ptr<ReplicaGroup> replicas_ = std::make_unique<SingleProcess>();
  std::unique_ptr<FaultInjection> faults_;
  TrainerState state_;
  std::string attention_yaml_;
  std::unique_ptr<StepMetrics> metrics_;  // throughput, MFU and memory peaks, once the model is built
};

}  // namespace darkformer
