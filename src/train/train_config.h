// The train, eval and log sections of a run config. Every field's default lives here, next to
// its doc line; configs/reference.yaml documents the same keys.
#pragma once

#include <string>
#include <vector>

#include "distributed/distributed_config.h"
#include "util/config_reader.h"

namespace darkformer {

enum class NonfiniteAction { kSkip, kStop };
enum class TrainDevice { kAuto, kCpu, kCuda };
enum class Precision { kFloat32, kBf16Autocast };
enum class LrSchedule { kConstant, kCosine, kLinear, kWsd };

// Spellings of the enum-valued keys (config files, logs).
inline const std::vector<std::pair<std::string, NonfiniteAction>> kNonfiniteActionNames = {
    {"skip", NonfiniteAction::kSkip}, {"stop", NonfiniteAction::kStop}};
inline const std::vector<std::pair<std::string, TrainDevice>> kTrainDeviceNames = {
    {"auto", TrainDevice::kAuto}, {"cpu", TrainDevice::kCpu}, {"cuda", TrainDevice::kCuda}};
inline const std::vector<std::pair<std::string, Precision>> kPrecisionNames = {
    {"float32", Precision::kFloat32}, {"bf16_autocast", Precision::kBf16Autocast}};
inline const std::vector<std::pair<std::string, LrSchedule>> kLrScheduleNames = {
    {"constant", LrSchedule::kConstant}, {"cosine", LrSchedule::kCosine}, {"linear", LrSchedule::kLinear},
    {"wsd", LrSchedule::kWsd}};

struct SpikeConfig {
  int64_t window = 50;              // rolling window of recent steps for mean/std
  int64_t min_history = 20;         // steps in the window before spikes can be flagged
  double loss_z = 4.0;              // loss z-score above which a step is a spike
  double grad_norm_z = 6.0;         // grad-norm z-score above which a step is a spike
  double min_loss_ratio = 1.5;      // loss / recent minimum above which a step is a spike
  // Every flag also needs the loss at least this many nats above the window mean: near zero loss
  // the z-scores and the ratio to the minimum fire on noise (a 1e-4 -> 2e-4 "spike").
  double min_loss_increase = 0.05;
  bool skip_update = false;         // drop the optimizer update of a spike step
  NonfiniteAction on_nonfinite = NonfiniteAction::kSkip;  // non-finite loss or grad norm: skip | stop
};

// Test hooks (train.fault_injection): faults injected on purpose so tests can prove the spike,
// non-finite and interruption paths. Steps are 1-based optimizer steps; 0 = off. Leave unset in
// real runs.
struct FaultInjectionConfig {
  int64_t lr_multiplier_step = 0;     // lr_multiplier_at_step.step: this step's lr is multiplied...
  double lr_multiplier_factor = 1.0;  // lr_multiplier_at_step.factor: ...by this factor
  int64_t nan_loss_at_step = 0;       // this step's loss (and so its gradients) becomes NaN...
  int64_t nan_loss_rank = -1;         // ...on this data-parallel rank only (-1: every rank)
  int64_t stop_at_step = 0;           // acts as a SIGINT arriving during this step
};

struct TrainConfig {
  int64_t steps = 200;               // optimizer steps
  std::string init_from;             // weights .h5 (converted HF or ours) or a run dir's checkpoint; "" = scratch
  double init_std = 0.02;            // normal init std when training from scratch
  uint64_t seed = 0;                 // model init, kernel draws and the global RNG
  TrainDevice device = TrainDevice::kAuto;   // auto | cpu | cuda
  // float32 | bf16_autocast: bf16 compute under autocast (CPU and CUDA), fp32 master weights,
  // random-feature attention in fp32; eval and generate honour it too.
  Precision precision = Precision::kFloat32;
  // TF32 for fp32 matmuls and convolutions on CUDA (Ampere and later): auto = on for CUDA runs;
  // true on the CPU is refused (it has no TF32); false keeps full fp32 GEMMs.
  std::string tf32 = "auto";
  // The peak for MFU in the step line and metrics.jsonl, TFLOP/s: 0 = a known GPU's dense bf16 peak
  // by its name (H100/H200 989, A100 312), none on a CPU (MFU then stays null).
  double peak_tflops = 0.0;
  // Recompute each decoder layer in the backward instead of keeping its activations (only each
  // layer's input is kept): memory for about one more forward.
  bool activation_checkpointing = false;
  // Cross-entropy through the LM head this many tokens at a time, its gradients computed in the
  // forward: the B x L x vocab logits never exist in full (0 = the plain full-logit loss).
  int64_t loss_chunk_tokens = 0;
  // Frozen Linear weights (projections, MLP) stored in bf16: half their memory (3.8 GB of
  // Gemma-2B's q/k/v-only finetune). Needs bf16_autocast; the embedding (the tied LM head), norms
  // and kernel parameters stay fp32, as does every trainable weight.
  bool frozen_weights_bf16 = false;
  // Refuse to start when the memory estimate (train/memory_estimate.h, within ~15 %) exceeds the
  // device's free memory (train/fit_check.h). Sizes that cannot fit at all are refused regardless.
  bool memory_check = true;
  bool deterministic = false;        // CPU: deterministic algorithms, single thread, bit-exact resume
  int64_t threads = 0;               // CPU intra-op threads; 0 = LibTorch's default
  // Optimizer: AdamW. Parameters matching no_decay globs get no weight decay.
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::vector<std::string> no_decay = {"*norm*", "*.kernel.*"};
  // Schedule: constant | cosine | linear | wsd (warmup-stable-decay).
  LrSchedule schedule = LrSchedule::kCosine;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;         // final lr / peak lr for cosine, linear and wsd
  double decay_fraction = 0.2;       // wsd: the final fraction of steps that decays
  double grad_clip = 1.0;            // max global grad norm; 0 = off
  int64_t grad_accum = 1;            // micro-batches per optimizer step
  std::vector<std::string> trainable = {"*"};  // parameter-name globs; the rest is frozen
  int64_t checkpoint_every = 100;    // steps between checkpoints (and one at the end); 0 = end only
  int64_t keep_last = 2;             // checkpoints kept
  SpikeConfig spikes;
  FaultInjectionConfig fault_injection;
  // train.profile: {start_step, steps}: a Chrome trace of those optimizer steps (LibTorch's Kineto
  // profiler: CPU activities, and CUDA's on a GPU) in the run directory; steps 0 = off.
  struct ProfileConfig {
    int64_t start_step = 1;
    int64_t steps = 0;
  } profile;
  DistributedConfig distributed;  // used when torchrun starts several ranks (docs/distributed.md)

  static TrainConfig FromConfig(const ConfigReader& reader);
};

struct EvalConfig {
  int64_t every = 50;     // steps between evals (and one at the end); 0 = end only
  int64_t batches = 8;    // validation batches per eval
  static EvalConfig FromConfig(const ConfigReader& reader);
};

struct LogConfig {
  std::string dir = "runs/run";  // run directory
  int64_t every = 1;             // steps between progress lines (JSONL gets every step)
  static LogConfig FromConfig(const ConfigReader& reader);
};

}  // namespace darkformer
