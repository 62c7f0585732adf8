// The training loop (see trainer.h); losses and evaluation in trainer_loss.cpp, joining and
// checking the replica group in trainer_replicas.cpp.
#include "train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <vector>

#include "model/weights_io.h"
#include "train/clip_grad_norm.h"
#include "train/config_diff.h"
#include "train/fit_check.h"
#include "train/model_loading.h"
#include "train/rewind.h"
#include "train/lr_schedule.h"
#include "train/step_profiler.h"
#include "train/trainable_set.h"
#include "util/build_version.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
std::atomic<bool> g_stop_requested{false};

void InstallStopSignalHandlers() {
  auto handler = [](int) { g_stop_requested.store(true); };
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  const auto& t = config_.train;
  device_ = ResolveDevice(config_);
  if (t.threads > 0) torch::set_num_threads(static_cast<int>(t.threads));
  if (t.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, false);
    torch::set_num_threads(1);
    // cuBLAS reproduces its sums only with a fixed workspace, read when its first handle is made
    // (CUDA's "Reproducibility" notes); a value the user set is kept.
    if (device_.is_cuda()) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  }
  ApplyTf32(t.tf32, device_);
  YAML::Emitter attention;
  attention << config_.resolved["attention"];
  attention_yaml_ = config_.resolved["attention"] ? attention.c_str() : "";
}

// ---- Run and its phases -------------------------------------------------------------------

int Trainer::Run() {
  JoinReplicaGroup();
  {
    // Before the run directory is touched. CPU ranks of one host share its memory; GPUs have their own.
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int64_t sharing = device_.is_cuda() || !local ? 1 : std::max(1L, std::atol(local));
    CheckRunFits(config_, Workload::kTrain, device_, replicas_->world_size(), sharing);
  }
  CheckResumedConfig(config_);  // before the run directory is touched, so a refusal leaves it as it was
  if (is_rank_zero()) log_ = std::make_unique<RunLog>(config_.log.dir);  // locks the run directory
  if (AnyRank(log_ && AlreadyFinished(), "checking for a finished run")) return kExitOk;
  if (log_) {
    spdlog::info("darkformer {}: run directory {}", BuildVersion(), config_.log.dir);
    log_->WriteConfig(config_.resolved);
  }
  Setup();
  Resume();
  if (log_) log_->OpenAfterStep(state_.step, state_.rewinds);
  const auto& t = config_.train;
  model_->train();
  const auto run_start = Clock::now();
  const double wall_before = state_.wall_seconds;
  StepProfiler profiler(t.profile.start_step, log_ ? t.profile.steps : 0, device_, config_.log.dir);
  while (state_.step < t.steps) {
    profiler.BeforeStep(state_.step + 1);
    const auto step = TrainStep();
    profiler.AfterStep(state_.step + 1);
    if (!step.finite && t.spikes.on_nonfinite == NonfiniteAction::kStop) {
      ++state_.skipped_updates;  // the stopped step is not logged as done
      WriteNonfinite(step);
      return Finish(kExitDiverged);
    }
    RecordStep(step);
    const auto after = HandleDivergence(step);
    if (after == AfterDivergence::kStop) return Finish(kExitDiverged);
    if (after == AfterDivergence::kRewound) continue;  // at the checkpoint's step, which was evaluated and saved
    MaybeEvaluate();
    state_.wall_seconds = wall_before + std::chrono::duration<double>(Clock::now() - run_start).count();
    const bool stop = AnyRank(g_stop_requested.load() || faults_->StopsAfter(state_.step),
                              "agreeing on a stop request");
    MaybeCheckpoint(stop);
    if (stop && state_.step < t.steps) {
      spdlog::warn("stop requested: checkpoint written at step {} in {}; rerun the same command to resume",
                   state_.step, config_.log.dir);
      return Finish(kExitInterrupted);
    }
  }
  return Finish(kExitOk);
}

// A finished run's results are final: rerunning its command must not rewrite them.
bool Trainer::AlreadyFinished() const {
  const auto summary = log_->ReadSummary();
  const auto latest = ListCheckpoints(config_.log.dir);
  if (!summary || summary->steps < config_.train.steps || latest.empty() || latest.back().first < summary->steps) {
    return false;
  }
  spdlog::info("{} already finished {} of {} steps (summary.json); nothing to do. Raise train.steps to train on.",
               config_.log.dir, summary->steps, config_.train.steps);
  return true;
}

void Trainer::Setup() {
  BuildModel();
  optimizer_ = MakeAdamW(*model_, config_.train);
  train_loader_ = OpenBatchSource(config_.data, "train");
  CheckVocabulary(*train_loader_);
  ApplyDocumentMasking(*train_loader_);
  val_loader_ = OpenBatchSource(config_.data, "val");
  spikes_ = std::make_unique<SpikeMonitor>(config_.train.spikes);
  divergence_ = std::make_unique<DivergenceDetector>(config_.train.spikes.divergence);
  faults_ = std::make_unique<FaultInjection>(config_.train.fault_injection, replicas_->rank());
}

// Resumes from the newest checkpoint that loads; an unreadable one (a disk error, a bad copy) is
// skipped with a warning naming it, so one bad file costs its steps, not the run.
void Trainer::Resume() {
  auto checkpoints = ListCheckpoints(config_.log.dir);
  if (checkpoints.empty()) {
    CalibrateKernels();  // a fresh start; a resumed run restores the kernels' trained state instead
  }
  std::string failures;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    try {
      state_ = LoadCheckpoint(it->second, *model_, *optimizer_);
    } catch (const std::exception& e) {
      spdlog::warn("checkpoint {} is unreadable, trying an older one: {}", it->second, e.what());
      const std::string why = e.what();
      failures += (failures.empty() ? " " : "; ") + it->second + ": " + why.substr(0, why.find('\n'));  // one line
      continue;
    }
    train_loader_->Restore(state_.loader);
    spikes_->Restore(state_.spike_window);
    divergence_->Restore(state_.divergence);
    spdlog::info("resumed from {} at step {}", it->second, state_.step);
    break;
  }
  DF_CHECK(checkpoints.empty() || failures.empty() || state_.step > 0,
           "no checkpoint of " << config_.log.dir << " could be loaded (the run is not restarted from scratch "
                               << "over them; move them away to do that):" << failures);
  // A checkpoint write killed midway leaves a .tmp file.
  if (is_rank_zero()) RemoveStaleCheckpointFiles(config_.log.dir);
  // Every rank read the run directory (a shared filesystem); they must have resumed together.
  const auto steps = replicas_->AllGather(state_.step, "comparing resumed steps");
  for (int64_t r = 0; r < replicas_->world_size(); ++r) {
    DF_CHECK(steps[r] == steps[0], "rank " << r << " resumed " << config_.log.dir << " at step " << steps[r]
                                           << " but rank 0 at step " << steps[0]
                                           << ": every rank must see the same run directory (a shared filesystem)");
  }
  CheckRanksBuiltTheSameModel();
  // As torch DDP: rank 0's parameters and buffers (kernel draws, calibration) on every rank, then
  // the gradient hooks.
  std::vector<torch::Tensor> state;
  for (const auto& p : model_->parameters()) state.push_back(p);
  for (const auto& b : model_->buffers()) state.push_back(b);
  replicas_->BroadcastFromRankZero(state, "broadcasting rank 0's parameters");
  WatchTrainableGradients();
}

double Trainer::StepLr(int64_t step) const {
  const auto& t = config_.train;
  double lr = ScheduledLr(t.schedule, t.lr, step - 1, t.steps, t.warmup_steps, t.min_lr_ratio, t.decay_fraction);
  if (step <= state_.lr_factor_until) lr *= t.spikes.rewind.lr_factor;  // after a rewind
  const int64_t data_batch = MicroBatchesRead(train_loader_->state()) / t.grad_accum + 1;
  return lr * faults_->LrFactor(data_batch);
}

Trainer::StepResult Trainer::TrainStep() {
  const auto& t = config_.train;
  const auto start = Clock::now();
  const int64_t this_step = state_.step + 1;  // 1-based, as logged
  // Redraws due before this step (attention_kernel.h): the draw a checkpoint holds is the one its
  // last step trained.
  for (int64_t i = 0; i < config_.model.num_hidden_layers; ++i) {
    model_->attention_layer(i)->kernel()->before_train_step(state_.step);
  }
  StepResult r;
  r.lr = StepLr(this_step);
  ApplyLr(r.lr);
  replicas_->ZeroGradients(trainable_);
  r.position = train_loader_->state();
  const auto micro_batches = ReadMicroBatches();
  std::vector<torch::Tensor> shares;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    shares.push_back(MicroBatchBackward(micro_batches[i], i + 1 == micro_batches.size(), this_step));
    r.tokens += micro_batches[i].ids.numel();
  }
  // Clipped on the device; then one device-to-host copy for the step, its loss shares (summed in
  // fp64 in micro-batch order, as logged before) and the grad norm: the step's only wait.
  const double clip = t.grad_clip > 0 ? t.grad_clip : std::numeric_limits<double>::infinity();
  const auto grad_norm = ClipGradNorm(trainable_, clip);
  const auto shares_device = torch::stack(shares).to(torch::kFloat64);
  const auto read = torch::cat({shares_device, grad_norm.to(shares_device.device(), torch::kFloat64).reshape({1})})
                        .to(torch::kCPU);
  const auto* values = read.data_ptr<double>();
  double loss = 0.0;
  for (size_t i = 0; i < shares.size(); ++i) loss += values[i];
  r.grad_norm = values[shares.size()];
  // The logged loss and tokens are the global batch's.
  const auto totals = replicas_->Sum({loss, static_cast<double>(r.tokens)}, "summing the step's loss");
  r.loss = totals[0];
  r.tokens = static_cast<int64_t>(totals[1]);
  const auto& last_ids_BL = micro_batches.back().ids;
  r.finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (r.finite) r.verdict = spikes_->Observe(r.loss, r.grad_norm);
  // Before the update, so the magnitudes are those this step's forward saw (rank 0's slice).
  if (r.verdict.spike && log_) {
    AutocastScope autocast(device_.type(), bf16());
    r.attention = MeasureAttention(*model_, last_ids_BL);
  }
  if (!r.finite) {
    spdlog::warn("step {}: non-finite loss {} or grad norm {} ({})", this_step, r.loss, r.grad_norm,
                 EnumName(t.spikes.on_nonfinite, kNonfiniteActionNames));
  }
  r.skipped = !r.finite || (r.verdict.spike && t.spikes.skip_update);
  if (!r.skipped) optimizer_->step();
  r.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return r;
}

void Trainer::RecordStep(const StepResult& r) {
  if (r.skipped) ++state_.skipped_updates;
  // A spike is an event: consecutive flagged steps (a loss that stays up) count once.
  if (r.verdict.spike && !state_.previous_step_spiked) ++state_.spikes;
  state_.previous_step_spiked = r.verdict.spike;
  ++state_.step;
  state_.tokens_seen += r.tokens;
  if (r.finite) {
    state_.min_loss = state_.step == 1 || state_.min_loss == 0.0 ? r.loss : std::min(state_.min_loss, r.loss);
    state_.last_loss = r.loss;
    state_.final_loss = r.loss;
  }
  metrics_->Count(r.tokens, r.step_ms);
  if (log_) LogStep(r);
}

void Trainer::MaybeEvaluate() {
  const bool last = state_.step == config_.train.steps;
  const int64_t every = config_.eval.every;
  if (!val_loader_ || !(last || (every > 0 && state_.step % every == 0))) return;
  const auto r = Evaluate(*val_loader_, config_.eval.batches);
  if (last) state_.final_loss = r.loss;
  state_.best_eval_accuracy = std::max(state_.best_eval_accuracy, r.accuracy);
  if (log_) LogEval(r);
}

void Trainer::MaybeCheckpoint(bool stop) {
  const int64_t every = config_.train.checkpoint_every;
  if (!(stop || state_.step == config_.train.steps || (every > 0 && state_.step % every == 0))) return;
  if (is_rank_zero()) WriteCheckpoint();
  // The other ranks wait until the checkpoint is on disk: a job killed after this point resumes
  // from it on any number of ranks.
  replicas_->Barrier("waiting for rank 0's checkpoint of step " + std::to_string(state_.step));
}

int Trainer::Finish(int exit_code) {
  RunSummary s;
  s.steps = state_.step;
  s.tokens_seen = state_.tokens_seen;
  s.final_loss = state_.final_loss;
  s.min_loss = state_.min_loss;
  s.best_eval_accuracy = state_.best_eval_accuracy;
  s.spikes = state_.spikes;
  s.skipped_updates = state_.skipped_updates;
  s.diverged = exit_code == kExitDiverged;
  s.rewinds = state_.rewinds;
  s.batches_skipped = state_.batches_skipped;
  s.wall_seconds = state_.wall_seconds;
  s.mean_tokens_per_s = metrics_->mean_tokens_per_s();  // Setup() made metrics_
  s.mean_mfu = metrics_->mean_mfu();
  s.peak_memory_bytes = metrics_->run_peak_memory();
  s.kernel = config_.attention.kernel;
  if (log_) log_->Summary(s);
  replicas_->CheckReplicasAgree(model_->parameters(), state_.step);
  return exit_code;
}

// ---- Building blocks (freezing, bf16 storage and the optimizer: trainable_set.h) ----------
void Trainer::BuildModel() {
  model_ = BuildModelFrom(config_, config_.train.init_from, "config key 'train.init_from'");
  model_->to(device_);
  model_->SetActivationCheckpointing(config_.train.activation_checkpointing);
  const auto set = FreezeByGlobs(*model_, config_.train.trainable);
  trainable_ = set.parameters;
  if (config_.train.frozen_weights_bf16) {
    const int64_t converted = StoreFrozenLinearWeightsInBf16(*model_);
    spdlog::info("frozen Linear weights stored in bf16: {} parameters ({:.2f} GiB saved)", converted,
                 static_cast<double>(converted) * 2 / (1024.0 * 1024.0 * 1024.0));
  }
  metrics_ = std::make_unique<StepMetrics>(*model_, config_.data.seq_len, device_, config_.train.peak_tflops);
  spdlog::info("parameters: {} trainable, {} frozen ({} tensors trainable)", set.trainable, set.frozen,
               trainable_.size());
}

// Data with a larger vocabulary than the model's would index past the embedding at some later
// batch; refuse at the start instead.
void Trainer::CheckVocabulary(const BatchSource& loader) const {
  DF_CHECK(loader.vocab_size() <= config_.model.vocab_size,
           loader.Describe() << " was tokenized with a vocabulary of " << loader.vocab_size()
                             << " pieces, larger than model.vocab_size " << config_.model.vocab_size
                             << ": token ids up to " << loader.vocab_size() - 1 << " would index past the embedding");
}

void Trainer::ApplyDocumentMasking(const BatchSource& loader) {
  const auto& data = config_.data;
  if (!data.document_masking) return;
  const int64_t separator = loader.document_separator();
  if (!loader.PacksDocuments()) {
    spdlog::info("{}.document_masking: {} holds one example per row; nothing to mask", data.key_path, loader.Describe());
    return;
  }
  DF_CHECK(separator >= 0, "config key '" << data.key_path << ".document_masking' is true, but " << loader.Describe()
                                          << " records no EOS id, so no document boundary can be found (prepare "
                                             "pre-tokenized shards with their EOS id, or set it to false)");
  model_->SetDocumentMasking({separator, data.document_positions == DocumentPositions::kRestart});
  spdlog::info("document masking: a document starts after each EOS ({}); RoPE positions {}", separator,
               data.document_positions == DocumentPositions::kRestart ? "restart per document" : "continue across the window");
}

// Data-aware kernel initialisation (DARKFormer's whitening, 000 App. C): each kernel that asks is
// handed one training batch's queries and keys at its own layer, layer by layer, so it sees the
// inputs that the already-calibrated layers below produce.
void Trainer::CalibrateKernels() {
  int64_t wanted = 0;
  for (int64_t i = 0; i < config_.model.num_hidden_layers; ++i) {
    wanted += model_->attention_layer(i)->kernel()->wants_calibration() ? 1 : 0;
  }
  if (wanted == 0) return;
  // Its own loader: the training order is untouched. It reads the whole first global batch on
  // every rank, so the calibration is the one a single process makes.
  DataConfig whole_batch = config_.data;
  whole_batch.rank = 0;
  whole_batch.world_size = 1;
  const auto ids_BL = OpenBatchSource(whole_batch, "train")->Next().input_ids_BL.to(device_);
  torch::NoGradGuard no_grad;
  AutocastScope autocast(device_.type(), bf16());  // the run's precision (bf16 frozen weights need it)
  model_->ForEachAttentionInput(ids_BL, [&](const GemmaModelImpl::AttentionInput& in) {
    auto kernel = in.attention.kernel();
    if (!kernel->wants_calibration()) return;
    const auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
    kernel->Calibrate(q_BHLD, k_BHLD, in.attention.call().scale);
  });
  spdlog::info("kernels calibrated on {} layer(s) from one batch of {} tokens", wanted, ids_BL.numel());
}

void Trainer::ApplyLr(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

void Trainer::WriteCheckpoint() {
  state_.loader = train_loader_->state();
  state_.spike_window = spikes_->Serialize();
  state_.divergence = divergence_->Serialize();
  SaveCheckpoint(CheckpointPath(config_.log.dir, state_.step), *model_, *optimizer_, state_, attention_yaml_);
  // keep_last, and with rewinds on every checkpoint a later rewind could reach (train/rewind.h).
  for (const auto& path : CheckpointsToPrune(ListCheckpoints(config_.log.dir), state_.step, config_.train)) {
    fs::remove(path);
  }
}

}  // namespace darkformer
