// Reading the train, eval and log sections (see train_config.h).
#include "train/train_config.h"

namespace darkformer {

static SpikeConfig ReadSpikes(const ConfigReader& r) {
  SpikeConfig s;
  s.window = r.Get<int64_t>("window", s.window);
  s.min_history = r.Get<int64_t>("min_history", s.min_history);
  s.loss_z = r.Get<double>("loss_z", s.loss_z);
  s.grad_norm_z = r.Get<double>("grad_norm_z", s.grad_norm_z);
  s.min_loss_ratio = r.Get<double>("min_loss_ratio", s.min_loss_ratio);
  s.min_loss_increase = r.Get<double>("min_loss_increase", s.min_loss_increase);
  DF_CHECK(s.min_loss_increase >= 0, "config key '" << r.KeyPath("min_loss_increase") << "' must be >= 0, got "
                                                    << s.min_loss_increase);
  s.skip_update = r.Get<bool>("skip_update", s.skip_update);
  s.on_nonfinite = r.GetEnum("on_nonfinite", s.on_nonfinite, kNonfiniteActionNames);
  r.RejectUnknown();
  DF_CHECK(s.window >= 2, "config key '" << r.KeyPath("window") << "' must be >= 2");
  return s;
}

static FaultInjectionConfig ReadFaultInjection(const ConfigReader& r) {
  FaultInjectionConfig f;
  const auto lr = r.Child("lr_multiplier_at_step");
  f.lr_multiplier_step = lr.Get<int64_t>("step", f.lr_multiplier_step);
  f.lr_multiplier_factor = lr.Get<double>("factor", f.lr_multiplier_factor);
  lr.RejectUnknown();
  f.nan_loss_at_step = r.Get<int64_t>("nan_loss_at_step", f.nan_loss_at_step);
  f.nan_loss_rank = r.Get<int64_t>("nan_loss_rank", f.nan_loss_rank);
  f.stop_at_step = r.Get<int64_t>("stop_at_step", f.stop_at_step);
  r.RejectUnknown();
  DF_CHECK(f.lr_multiplier_step >= 0, "config key '" << lr.KeyPath("step") << "' must be >= 0");
  DF_CHECK(f.lr_multiplier_factor > 0, "config key '" << lr.KeyPath("factor") << "' must be positive");
  DF_CHECK(f.nan_loss_at_step >= 0, "config key '" << r.KeyPath("nan_loss_at_step") << "' must be >= 0");
  DF_CHECK(f.stop_at_step >= 0, "config key '" << r.KeyPath("stop_at_step") << "' must be >= 0");
  return f;
}

TrainConfig TrainConfig::FromConfig(const ConfigReader& r) {
  TrainConfig t;
  t.steps = r.Get<int64_t>("steps", t.steps);
  t.init_from = r.Get<std::string>("init_from", t.init_from);
  t.init_std = r.Get<double>("init_std", t.init_std);
  t.seed = r.Get<uint64_t>("seed", t.seed);
  t.device = r.GetEnum("device", t.device, kTrainDeviceNames);
  t.precision = r.GetEnum("precision", t.precision, kPrecisionNames);
  t.tf32 = r.Get<std::string>("tf32", t.tf32);
  t.peak_tflops = r.Get<double>("peak_tflops", t.peak_tflops);
  DF_CHECK(t.peak_tflops >= 0, "config key '" << r.KeyPath("peak_tflops") << "' must be >= 0, got " << t.peak_tflops);
  DF_CHECK(t.tf32 == "auto" || t.tf32 == "true" || t.tf32 == "false",
           "config key '" << r.KeyPath("tf32") << "' must be auto, true or false, got '" << t.tf32 << "'");
  t.activation_checkpointing = r.Get<bool>("activation_checkpointing", t.activation_checkpointing);
  t.loss_chunk_tokens = r.Get<int64_t>("loss_chunk_tokens", t.loss_chunk_tokens);
  DF_CHECK(t.loss_chunk_tokens >= 0, "config key '" << r.KeyPath("loss_chunk_tokens")
                                                    << "' must be >= 0 (0 = the full-logit loss), got "
                                                    << t.loss_chunk_tokens);
  t.frozen_weights_bf16 = r.Get<bool>("frozen_weights_bf16", t.frozen_weights_bf16);
  t.memory_check = r.Get<bool>("memory_check", t.memory_check);
  t.deterministic = r.Get<bool>("deterministic", t.deterministic);
  t.threads = r.Get<int64_t>("threads", t.threads);
  t.lr = r.Get<double>("lr", t.lr);
  t.beta1 = r.Get<double>("beta1", t.beta1);
  t.beta2 = r.Get<double>("beta2", t.beta2);
  t.eps = r.Get<double>("eps", t.eps);
  t.weight_decay = r.Get<double>("weight_decay", t.weight_decay);
  t.no_decay = r.Get<std::vector<std::string>>("no_decay", t.no_decay);
  t.schedule = r.GetEnum("schedule", t.schedule, kLrScheduleNames);
  t.warmup_steps = r.Get<int64_t>("warmup_steps", t.warmup_steps);
  t.min_lr_ratio = r.Get<double>("min_lr_ratio", t.min_lr_ratio);
  t.decay_fraction = r.Get<double>("decay_fraction", t.decay_fraction);
  t.grad_clip = r.Get<double>("grad_clip", t.grad_clip);
  t.grad_accum = r.Get<int64_t>("grad_accum", t.grad_accum);
  t.trainable = r.Get<std::vector<std::string>>("trainable", t.trainable);
  t.checkpoint_every = r.Get<int64_t>("checkpoint_every", t.checkpoint_every);
  t.keep_last = r.Get<int64_t>("keep_last", t.keep_last);
  t.spikes = ReadSpikes(r.Child("spikes"));
  t.fault_injection = ReadFaultInjection(r.Child("fault_injection"));
  {
    const auto p = r.Child("profile");
    t.profile.start_step = p.Get<int64_t>("start_step", t.profile.start_step);
    t.profile.steps = p.Get<int64_t>("steps", t.profile.steps);
    p.RejectUnknown();
    DF_CHECK(t.profile.start_step >= 1, "config key '" << p.KeyPath("start_step") << "' must be >= 1 (steps count from 1)");
    DF_CHECK(t.profile.steps >= 0, "config key '" << p.KeyPath("steps") << "' must be >= 0");
  }
  t.distributed = DistributedConfig::FromConfig(r.Child("distributed"));
  r.RejectUnknown();
  auto key = [&](const char* k) { return r.KeyPath(k); };
  DF_CHECK(t.steps > 0, "config key '" << key("steps") << "' must be positive");
  DF_CHECK(t.lr > 0, "config key '" << key("lr") << "' must be positive");
  DF_CHECK(t.grad_accum >= 1, "config key '" << key("grad_accum") << "' must be >= 1");
  DF_CHECK(t.keep_last >= 1, "config key '" << key("keep_last") << "' must be >= 1");
  DF_CHECK(t.warmup_steps >= 0, "config key '" << key("warmup_steps") << "' must be >= 0, got " << t.warmup_steps);
  DF_CHECK(t.checkpoint_every >= 0,
           "config key '" << key("checkpoint_every") << "' must be >= 0 (0 = at the end only), got " << t.checkpoint_every);
  DF_CHECK(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, "config key '" << key("min_lr_ratio") << "' must be in [0, 1]");
  DF_CHECK(t.decay_fraction >= 0 && t.decay_fraction <= 1, "config key '" << key("decay_fraction") << "' must be in [0, 1]");
  DF_CHECK(t.grad_clip >= 0, "config key '" << key("grad_clip") << "' must be >= 0 (0 = off)");
  DF_CHECK(t.threads >= 0, "config key '" << key("threads") << "' must be >= 0 (0 = LibTorch's default)");
  DF_CHECK(!t.frozen_weights_bf16 || t.precision == Precision::kBf16Autocast,
           "config key '" << key("frozen_weights_bf16") << "' needs train.precision: bf16_autocast (bf16 weights "
                          << "meet fp32 activations outside autocast)");
  DF_CHECK(!t.trainable.empty(), "config key '" << key("trainable") << "' must list at least one glob");
  return t;
}

EvalConfig EvalConfig::FromConfig(const ConfigReader& r) {
  EvalConfig e;
  e.every = r.Get<int64_t>("every", e.every);
  e.batches = r.Get<int64_t>("batches", e.batches);
  r.RejectUnknown();
  DF_CHECK(e.batches >= 1, "config key '" << r.KeyPath("batches") << "' must be >= 1");
  DF_CHECK(e.every >= 0, "config key '" << r.KeyPath("every") << "' must be >= 0 (0 = at the end only)");
  return e;
}

LogConfig LogConfig::FromConfig(const ConfigReader& r) {
  LogConfig l;
  // A present but empty value (`dir:` or `--set log.dir=`) is not the default run directory.
  DF_CHECK(!(r.node().IsMap() && r.node()["dir"] && r.node()["dir"].IsNull()),
           "config key '" << r.KeyPath("dir") << "' must not be empty");
  l.dir = r.Get<std::string>("dir", l.dir);
  l.every = r.Get<int64_t>("every", l.every);
  r.RejectUnknown();
  DF_CHECK(l.dir.find_first_not_of(" \t\r\n") != std::string::npos,
           "config key '" << r.KeyPath("dir") << "' must not be empty or only whitespace");
  DF_CHECK(l.every >= 0, "config key '" << r.KeyPath("every") << "' must be >= 0 (0 = no progress lines)");
  return l;
}

}  // namespace darkformer
