// The training loop (see trainer.h).
#include "train/trainer.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "attention/darkformer_kernel.h"
#include "model/weights_io.h"
#include "train/attention_stats.h"
#include "train/lr_schedule.h"
#include "util/json_line.h"

namespace darkformer {

namespace fs = std::filesystem;
std::atomic<bool> g_stop_requested{false};

void InstallStopSignalHandlers() {
  auto handler = [](int) { g_stop_requested.store(true); };
  std::signal(SIGINT, handler);
  std::signal(SIGTERM, handler);
}

bool MatchesAny(const std::string& name, const std::vector<std::string>& globs) {
  for (const auto& glob : globs) {
    if (fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// Keeps the lines of a JSONL log whose "step" is at most `step` (lines without one are kept).
static void TruncateJsonlAfterStep(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const auto at = line.find("\"step\":");
    if (at != std::string::npos) {
      const char* digits = line.c_str() + at + 7;
      char* end = nullptr;
      const long long line_step = std::strtoll(digits, &end, 10);
      if (end == digits || line.back() != '}' || line_step > step) {  // a later step, or a line torn by a kill
        dropped = true;
        continue;
      }
    }
    kept += line + "\n";
  }
  in.close();
  if (dropped) std::ofstream(path, std::ios::trunc) << kept;
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  const auto& t = config_.train;
  if (t.device == "cuda" || (t.device == "auto" && torch::cuda::is_available())) {
    DF_CHECK(torch::cuda::is_available(), "config key 'train.device' is cuda, but no CUDA device is available");
    device_ = torch::Device(torch::kCUDA);
  }
  if (t.threads > 0) torch::set_num_threads(static_cast<int>(t.threads));
  if (t.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, false);
    torch::set_num_threads(1);
  }
  YAML::Emitter attention;
  attention << config_.resolved["attention"];
  attention_yaml_ = config_.resolved["attention"] ? attention.c_str() : "";
}

void Trainer::BuildModel() {
  torch::manual_seed(config_.train.seed);
  model_ = GemmaModel(config_.model, config_.attention);
  std::string init = config_.train.init_from;
  if (!init.empty() && fs::is_directory(init)) {
    const auto latest = LatestCheckpoint(init);
    DF_CHECK(latest, "config key 'train.init_from': run directory " << init << " has no checkpoint");
    init = *latest;
  }
  if (init.empty()) {
    model_->InitializeWeights(config_.train.init_std, config_.train.seed);
  } else {
    // A different kernel than the weights were trained with is the paper's finetuning swap: its
    // own parameters (M, W) keep the initialisation its options give.
    LoadWeights(init, *model_, {.kernel_state_optional = true});
    spdlog::info("initialised from {}", init);
  }
  model_->to(device_);
  int64_t trainable = 0, frozen = 0;
  for (const auto& item : model_->named_parameters()) {
    auto param = item.value();
    const bool train = MatchesAny(item.key(), config_.train.trainable);
    param.set_requires_grad(train);
    (train ? trainable : frozen) += param.numel();
    if (train) trainable_.push_back(param);
  }
  DF_CHECK(!trainable_.empty(), "config key 'train.trainable' matches no parameter");
  spdlog::info("parameters: {} trainable, {} frozen ({} tensors trainable)", trainable, frozen, trainable_.size());
}

// DARKFormer's data-aware start (000 App. C): M = Lambda^-1/2 from the queries and keys of one
// training batch, layer by layer, so each layer sees inputs from already-calibrated layers.
void Trainer::CalibrateWhiteningKernels() {
  std::vector<std::pair<int64_t, DarkformerKernelImpl*>> targets;
  for (int64_t i = 0; i < config_.model.num_hidden_layers; ++i) {
    auto* kernel = dynamic_cast<DarkformerKernelImpl*>(model_->attention_layer(i)->kernel().get());
    if (kernel && kernel->init() == DarkformerInit::kWhitening) targets.emplace_back(i, kernel);
  }
  if (targets.empty()) return;
  PackedLoader calibration(config_.data, "train");  // its own loader: the training order is untouched
  const auto ids = calibration.Next().input_ids_BL.to(device_);
  torch::NoGradGuard no_grad;
  for (const auto& [layer, kernel] : targets) {
    const auto x = model_->LayerInput(ids, layer);
    const auto qk = model_->attention_layer(layer)->QueriesKeys(x, model_->RopeFor(layer, ids.size(1), device_));
    kernel->Calibrate(qk.first, qk.second, model_->attention_layer(layer)->call().scale);
  }
  spdlog::info("darkformer whitening: M calibrated on {} layer(s) from one batch of {} tokens", targets.size(),
               ids.numel());
}

void Trainer::BuildOptimizer() {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().requires_grad()) continue;  // frozen: no optimizer state at all
    (MatchesAny(item.key(), config_.train.no_decay) ? no_decay : decay).push_back(item.value());
  }
  const auto& t = config_.train;
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(decay, options(t.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  optimizer_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(t.lr));
}

void Trainer::ApplyLr(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

EvalResult Trainer::Evaluate(PackedLoader& loader, int64_t batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto saved = loader.state();
  double loss_sum = 0.0;
  int64_t correct = 0, tokens = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const auto batch = loader.Next();
    const auto ids = batch.input_ids_BL.to(device_), labels = batch.labels_BL.to(device_);
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
  EvalResult r;
  r.tokens = tokens;
  r.loss = tokens ? loss_sum / static_cast<double>(tokens) : 0.0;
  r.perplexity = std::exp(r.loss);
  r.accuracy = tokens ? static_cast<double>(correct) / static_cast<double>(tokens) : 0.0;
  return r;
}

EvalResult Trainer::EvaluateFrom(PackedLoader& loader, int64_t batches) {
  BuildModel();
  return Evaluate(loader, batches);
}

void Trainer::WriteNonfinite(int64_t step, double loss, double grad_norm, const LoaderState& position) {
  JsonLine where;
  where.Add("step", step).Add("loss", loss).Add("grad_norm", grad_norm);
  // The position before the step took its batches: restoring it replays the offending batch.
  where.Add("loader_seed", static_cast<int64_t>(position.seed)).Add("loader_epoch", position.epoch);
  where.Add("loader_step", position.step).Add("grad_accum", config_.train.grad_accum);
  std::vector<int64_t> rows;  // unshuffled row indices of every micro-batch (PackedLoader::FillRow)
  for (int64_t micro = 0; micro < config_.train.grad_accum; ++micro) {
    const int64_t per_epoch = train_loader_->batches_per_epoch();
    const int64_t batch = position.step + micro;
    for (const auto row : train_loader_->RowsOfBatch(position.epoch + batch / per_epoch, batch % per_epoch)) {
      rows.push_back(row);
    }
  }
  where.AddInts("rows", rows);
  std::ofstream(fs::path(config_.log.dir) / "nonfinite.json") << where.str() << "\n";
  spdlog::error("stopping on a non-finite loss at step {}; the batch position is in {}/nonfinite.json", step,
                config_.log.dir);
}

void Trainer::WriteCheckpoint() {
  state_.loader = train_loader_->state();
  state_.spike_window = spikes_->Serialize();
  SaveCheckpoint(CheckpointPath(config_.log.dir, state_.step), *model_, *optimizer_, state_, attention_yaml_);
  PruneCheckpoints(config_.log.dir, config_.train.keep_last);
}

void Trainer::LogStep(double loss, double grad_norm, double lr, double step_ms, int64_t tokens, const SpikeVerdict& v,
                      bool skipped, const std::vector<LayerAttentionStats>& attention) {
  JsonLine line;
  line.Add("type", "train").Add("step", state_.step).Add("tokens_seen", state_.tokens_seen).Add("loss", loss);
  line.Add("lr", lr).Add("grad_norm", grad_norm).Add("tokens_per_s", tokens / (step_ms / 1000.0));
  line.Add("step_ms", step_ms).Add("loss_z", v.loss_z).Add("grad_norm_z", v.grad_norm_z);
  line.Add("gpu_mem_bytes", static_cast<int64_t>(0)).Add("spike", v.spike).Add("skipped", skipped);
  metrics_ << line.str() << "\n" << std::flush;
  if (v.spike) {
    JsonLine event;
    event.Add("step", state_.step).Add("loss", loss).Add("window_mean", v.loss_mean).Add("window_std", v.loss_std);
    event.Add("z", v.loss_z).Add("grad_norm", grad_norm).Add("grad_norm_z", v.grad_norm_z);
    event.Add("loss_ratio_to_min", v.loss_ratio_to_min).Add("lr", lr).Add("reason", v.reason).Add("skipped", skipped);
    std::vector<std::string> layers;
    for (const auto& a : attention) {
      JsonLine layer;
      layer.Add("layer", a.layer).Add("kernel", a.kernel).Add("max_logit", a.max_logit);
      layer.Add("max_log_feature", a.max_log_feature);
      layers.push_back(layer.str());
    }
    event.AddObjects("layers", layers);
    spike_log_ << event.str() << "\n" << std::flush;
  }
  if (config_.log.every > 0 && (state_.step % config_.log.every == 0 || state_.step == config_.train.steps)) {
    const double remaining_s = step_ms / 1000.0 * static_cast<double>(config_.train.steps - state_.step);
    spdlog::info("step {:>6}/{} | loss {:.4f} (z {:+.1f}) | norm {:.3f} (z {:+.1f}) | lr {:.2e} | {:.0f} ms | "
                 "{:.0f} tok/s | ETA {:.0f}s{}",
                 state_.step, config_.train.steps, loss, v.loss_z, grad_norm, v.grad_norm_z, lr, step_ms,
                 tokens / (step_ms / 1000.0), remaining_s, v.spike ? " | SPIKE " + v.reason : "");
  }
}

void Trainer::LogEval(const EvalResult& r) {
  JsonLine line;
  line.Add("type", "eval").Add("step", state_.step).Add("tokens_seen", state_.tokens_seen).Add("loss", r.loss);
  line.Add("perplexity", r.perplexity).Add("accuracy", r.accuracy).Add("tokens", r.tokens);
  metrics_ << line.str() << "\n" << std::flush;
  spdlog::info("eval @ {}: loss {:.4f} | ppl {:.2f} | next-token accuracy {:.4f} | {} tokens", state_.step, r.loss,
               r.perplexity, r.accuracy, r.tokens);
}

void Trainer::WriteSummary(bool diverged, double mean_tokens_per_s) {
  JsonLine s;
  s.Add("steps", state_.step).Add("tokens_seen", state_.tokens_seen).Add("final_loss", last_eval_loss_);
  s.Add("min_loss", state_.min_loss).Add("best_eval_accuracy", state_.best_eval_accuracy);
  s.Add("spikes", state_.spikes).Add("skipped_updates", state_.skipped_updates).Add("diverged", diverged);
  s.Add("wall_seconds", state_.wall_seconds).Add("mean_tokens_per_s", mean_tokens_per_s);
  s.Add("kernel", config_.attention.kernel);
  std::ofstream(fs::path(config_.log.dir) / "summary.json") << s.str() << "\n";
}

int Trainer::Run() {
  const auto& t = config_.train;
  fs::create_directories(config_.log.dir);
  {
    YAML::Emitter out;
    out << config_.resolved;
    std::ofstream(fs::path(config_.log.dir) / "config.yaml") << out.c_str() << "\n";
  }
  BuildModel();
  BuildOptimizer();
  train_loader_ = std::make_unique<PackedLoader>(config_.data, "train");
  if (train_loader_->manifest().TotalDocuments(/*val=*/true) > 0) val_loader_ = std::make_unique<PackedLoader>(config_.data, "val");
  spikes_ = std::make_unique<SpikeMonitor>(t.spikes);
  CalibrateWhiteningKernels();  // a resumed run then restores the trained M from its checkpoint

  if (const auto latest = LatestCheckpoint(config_.log.dir)) {
    state_ = LoadCheckpoint(*latest, *model_, *optimizer_);
    train_loader_->Restore(state_.loader);
    spikes_->Restore(state_.spike_window);
    spdlog::info("resumed from {} at step {}", *latest, state_.step);
  }
  // Steps logged after the checkpoint we resume from will run again: drop their lines so each step
  // appears once. A checkpoint write killed midway leaves a .tmp file: remove it.
  TruncateJsonlAfterStep((fs::path(config_.log.dir) / "metrics.jsonl").string(), state_.step);
  TruncateJsonlAfterStep((fs::path(config_.log.dir) / "spikes.jsonl").string(), state_.step);
  RemoveStaleCheckpointFiles(config_.log.dir);
  metrics_.open(fs::path(config_.log.dir) / "metrics.jsonl", std::ios::app);
  spike_log_.open(fs::path(config_.log.dir) / "spikes.jsonl", std::ios::app);
  if (t.precision == "bf16_autocast" && device_.is_cuda()) {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  model_->train();
  bool diverged = false;
  double tokens_total = 0.0, seconds_total = 0.0;
  const auto run_start = std::chrono::steady_clock::now();
  const double wall_before = state_.wall_seconds;
  const auto& faults = t.fault_injection;
  while (state_.step < t.steps) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t this_step = state_.step + 1;  // 1-based, as logged
    double lr = ScheduledLr(t.schedule, t.lr, state_.step, t.steps, t.warmup_steps, t.min_lr_ratio,
                            t.decay_fraction);
    if (faults.lr_multiplier_step == this_step) lr *= faults.lr_multiplier_factor;
    ApplyLr(lr);
    optimizer_->zero_grad(/*set_to_none=*/true);
    const LoaderState batch_position = train_loader_->state();  // where this step's batches start
    double loss_sum = 0.0;
    int64_t tokens = 0;
    torch::Tensor last_ids_BL;
    for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
      const auto batch = train_loader_->Next();
      const auto ids = batch.input_ids_BL.to(device_), labels = batch.labels_BL.to(device_);
      auto loss = CausalLmLoss(model_->forward(ids), labels) / static_cast<double>(t.grad_accum);
      if (faults.nan_loss_at_step == this_step) loss = loss * std::numeric_limits<double>::quiet_NaN();
      loss.backward();
      loss_sum += loss.item<double>();
      tokens += ids.numel();
      last_ids_BL = ids;
    }
    const double clip = t.grad_clip > 0 ? t.grad_clip : std::numeric_limits<double>::infinity();
    const double grad_norm = torch::nn::utils::clip_grad_norm_(trainable_, clip);
    const bool finite = std::isfinite(loss_sum) && std::isfinite(grad_norm);
    const auto verdict = finite ? spikes_->Observe(loss_sum, grad_norm) : SpikeVerdict{};
    // Before the update, so the magnitudes are those this step's forward saw.
    const auto attention = verdict.spike ? MeasureAttention(*model_, last_ids_BL) : std::vector<LayerAttentionStats>{};
    bool skipped = false;
    if (!finite) {
      ++state_.skipped_updates;
      skipped = true;
      spdlog::warn("step {}: non-finite loss {} or grad norm {} ({})", this_step, loss_sum, grad_norm,
                   t.spikes.on_nonfinite);
      if (t.spikes.on_nonfinite == "stop") {
        WriteNonfinite(this_step, loss_sum, grad_norm, batch_position);
        diverged = true;
        break;
      }
    } else if (verdict.spike && t.spikes.skip_update) {
      ++state_.skipped_updates;
      skipped = true;
    } else {
      optimizer_->step();
    }
    // A spike is an event: consecutive flagged steps (a loss that stays up) count once.
    if (verdict.spike && !state_.previous_step_spiked) ++state_.spikes;
    state_.previous_step_spiked = verdict.spike;
    ++state_.step;
    state_.tokens_seen += tokens;
    for (int64_t i = 0; i < config_.model.num_hidden_layers; ++i) model_->attention_layer(i)->kernel()->on_train_step(state_.step);
    if (finite) state_.min_loss = state_.step == 1 || state_.min_loss == 0.0 ? loss_sum : std::min(state_.min_loss, loss_sum);
    const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    tokens_total += static_cast<double>(tokens);
    seconds_total += step_ms / 1000.0;
    LogStep(loss_sum, grad_norm, lr, step_ms, tokens, verdict, skipped, attention);

    const bool last = state_.step == t.steps;
    if (val_loader_ && ((config_.eval.every > 0 && state_.step % config_.eval.every == 0) || last)) {
      const auto r = Evaluate(*val_loader_, config_.eval.batches);
      last_eval_loss_ = r.loss;
      state_.best_eval_accuracy = std::max(state_.best_eval_accuracy, r.accuracy);
      LogEval(r);
    } else if (last) {
      last_eval_loss_ = loss_sum;
    }
    state_.wall_seconds = wall_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    const bool stop = g_stop_requested.load() || faults.stop_at_step == state_.step;
    if (last || stop || (t.checkpoint_every > 0 && state_.step % t.checkpoint_every == 0)) {
      WriteCheckpoint();
    }
    if (stop && !last) {
      spdlog::warn("stop requested: checkpoint written at step {} in {}; rerun the same command to resume",
                   state_.step, config_.log.dir);
      WriteSummary(false, seconds_total > 0 ? tokens_total / seconds_total : 0.0);
      return kExitInterrupted;
    }
  }
  WriteSummary(diverged, seconds_total > 0 ? tokens_total / seconds_total : 0.0);
  return diverged ? kExitDiverged : kExitOk;
}

}  // namespace darkformer
