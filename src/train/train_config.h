// The train, eval and log sections of a run config. Every field's default lives here; its doc
// line, accepted values and resume rule are declared where train_config.cpp reads it, and
// configs/reference.yaml and docs/config_keys.md are generated from those reads.
#pragma once

#include <string>
#include <vector>

#include "distributed/distributed_config.h"
#include "util/config_reader.h"

namespace darkformer {

enum class NonfiniteAction { kSkip, kStop };
enum class DivergenceAction { kContinue, kRewind, kStop };
enum class TrainDevice { kAuto, kCpu, kCuda };
enum class Precision { kFloat32, kBf16Autocast };
enum class LrSchedule { kConstant, kCosine, kLinear, kWsd };

// Spellings of the enum-valued keys (config files, logs).
inline const std::vector<std::pair<std::string, NonfiniteAction>> kNonfiniteActionNames = {
    {"skip", NonfiniteAction::kSkip}, {"stop", NonfiniteAction::kStop}};
inline const std::vector<std::pair<std::string, DivergenceAction>> kDivergenceActionNames = {
    {"continue", DivergenceAction::kContinue}, {"rewind", DivergenceAction::kRewind}, {"stop", DivergenceAction::kStop}};
inline const std::vector<std::pair<std::string, TrainDevice>> kTrainDeviceNames = {
    {"auto", TrainDevice::kAuto}, {"cpu", TrainDevice::kCpu}, {"cuda", TrainDevice::kCuda}};
inline const std::vector<std::pair<std::string, Precision>> kPrecisionNames = {
    {"float32", Precision::kFloat32}, {"bf16_autocast", Precision::kBf16Autocast}};
inline const std::vector<std::pair<std::string, LrSchedule>> kLrScheduleNames = {
    {"constant", LrSchedule::kConstant}, {"cosine", LrSchedule::kCosine}, {"linear", LrSchedule::kLinear},
    {"wsd", LrSchedule::kWsd}};

struct SpikeConfig {
  int64_t window = 50;
  int64_t min_history = 20;
  double loss_z = 4.0;
  double grad_norm_z = 6.0;
  double min_loss_ratio = 1.5;
  double min_loss_increase = 0.05;
  bool skip_update = false;
  NonfiniteAction on_nonfinite = NonfiniteAction::kSkip;
  // train/divergence.h: when a run has diverged, and what then.
  DivergenceAction on_divergence = DivergenceAction::kContinue;
  struct Divergence {
    int64_t spikes = 3;             // flagged steps ...
    int64_t window = 50;            // ... within this many steps
    bool nonfinite = true;          // a non-finite loss or grad norm
    int64_t consecutive_skips = 0;  // skipped updates in a row; 0 = off
  } divergence;
  struct Rewind {  // PaLM's remedy (train/rewind.h)
    int64_t min_steps_back = 0;
    int64_t skip_batches = 0;
    double lr_factor = 1.0;
    int64_t lr_steps = 0;
    int64_t max_rewinds = 3;
  } rewind;
};

// Test hooks (train.fault_injection): faults injected on purpose so tests can prove the spike,
// non-finite and interruption paths. Leave unset in real runs.
struct FaultInjectionConfig {
  // lr_multiplier_at_step.{step, factor, steps}: keyed to the data batch a step trains on (the
  // step number until a rewind skips batches), so a rewound run does not meet it again.
  int64_t lr_multiplier_step = 0;
  double lr_multiplier_factor = 1.0;
  int64_t lr_multiplier_steps = 1;
  int64_t nan_loss_at_step = 0;
  int64_t nan_loss_rank = -1;
  int64_t stop_at_step = 0;
  // SIGKILL at a phase of the first rewind: 1 after the abandoned checkpoints are removed, 2 after
  // rewinds.jsonl's row, 3 after the logs are cut back, 4 after the target is written again.
  int64_t kill_in_rewind = 0;
};

struct TrainConfig {
  int64_t steps = 200;
  std::string init_from;  // "" = scratch
  double init_std = 0.02;
  uint64_t seed = 0;
  TrainDevice device = TrainDevice::kAuto;
  Precision precision = Precision::kFloat32;
  std::string tf32 = "auto";
  double peak_tflops = 0.0;
  bool activation_checkpointing = false;
  int64_t loss_chunk_tokens = 0;
  bool frozen_weights_bf16 = false;
  bool memory_check = true;  // train/fit_check.h
  bool deterministic = false;
  int64_t threads = 0;
  // AdamW
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::vector<std::string> no_decay = {"*norm*", "*.kernel.*"};
  LrSchedule schedule = LrSchedule::kCosine;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;
  double decay_fraction = 0.2;
  double grad_clip = 1.0;
  int64_t grad_accum = 1;
  std::vector<std::string> trainable = {"*"};
  int64_t checkpoint_every = 100;
  int64_t keep_last = 2;
  SpikeConfig spikes;
  FaultInjectionConfig fault_injection;
  struct ProfileConfig {
    int64_t start_step = 1;
    int64_t steps = 0;
  } profile;
  DistributedConfig distributed;  // docs/distributed.md

  static TrainConfig FromConfig(const ConfigReader& reader);
};

struct EvalConfig {
  int64_t every = 50;
  int64_t batches = 8;
  static EvalConfig FromConfig(const ConfigReader& reader);
};

struct LogConfig {
  std::string dir = "runs/run";
  int64_t every = 1;
  static LogConfig FromConfig(const ConfigReader& reader);
};

}  // namespace darkformer
