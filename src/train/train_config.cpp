// Reading the train, eval and log sections (see train_config.h). Each key is declared where it is
// read: name, type, default (the struct's), doc line, accepted values and the resume rule
// (util/key_spec.h); configs/reference.yaml and docs/config_keys.md are made from these reads.
#include "train/train_config.h"

namespace darkformer {

static SpikeConfig ReadSpikes(const ConfigReader& r) {
  SpikeConfig s;
  s.window = r.Get("window", s.window, KeySpec("rolling window of recent steps for mean / std").Min(2));
  s.min_history = r.Get("min_history", s.min_history, "steps in the window before spikes are flagged");
  s.loss_z = r.Get("loss_z", s.loss_z, "loss z-score above which a step is a spike");
  s.grad_norm_z = r.Get("grad_norm_z", s.grad_norm_z, "grad-norm z-score above which a step is a spike");
  s.min_loss_ratio = r.Get("min_loss_ratio", s.min_loss_ratio, "loss / recent minimum above which a step is a spike; 0 = off");
  // Near zero loss the z-scores and the ratio to the minimum fire on noise (a 1e-4 -> 2e-4 "spike").
  s.min_loss_increase = r.Get("min_loss_increase", s.min_loss_increase,
                              KeySpec("every flag also needs loss >= window mean + this (nats): no spikes from noise near 0").Min(0));
  s.skip_update = r.Get("skip_update", s.skip_update, "drop the optimizer update of a spike step");
  s.on_nonfinite = r.GetEnum("on_nonfinite", s.on_nonfinite, kNonfiniteActionNames,
                             "non-finite loss or grad norm: skip the update, or stop (writes nonfinite.json with the batch position)");
  s.on_divergence = r.GetEnum("on_divergence", s.on_divergence, kDivergenceActionNames,
                              "a diverged run (train.spikes.divergence): carry on, rewind to an earlier checkpoint past the bad batches, or stop (exit 3)");
  {
    const auto d = r.Child("divergence", "when a run has diverged: any one rule");
    auto& v = s.divergence;
    v.spikes = d.Get("spikes", v.spikes, KeySpec("this many flagged steps ...").Min(1));
    v.window = d.Get("window", v.window, KeySpec("... within this many steps").Min(1));
    v.nonfinite = d.Get("nonfinite", v.nonfinite, "a non-finite loss or grad norm");
    v.consecutive_skips = d.Get("consecutive_skips", v.consecutive_skips,
                                KeySpec("this many skipped updates in a row").Min(0, "0 = off"));
    d.RejectUnknown();
  }
  {
    const auto w = r.Child("rewind", "on_divergence: rewind (docs/training.md)");
    auto& v = s.rewind;
    v.min_steps_back = w.Get("min_steps_back", v.min_steps_back,
                             KeySpec("reload the newest checkpoint this many steps or more before the update that preceded the episode's first bad step").Min(0));
    v.skip_batches = w.Get("skip_batches", v.skip_batches,
                           KeySpec("batches skipped past the divergence, besides those since the checkpoint").Min(0));
    v.lr_factor = w.Get("lr_factor", v.lr_factor, KeySpec("the lr multiplier after a rewind ...").Above(0));
    v.lr_steps = w.Get("lr_steps", v.lr_steps, KeySpec("... for this many steps").Min(0));
    v.max_rewinds = w.Get("max_rewinds", v.max_rewinds, KeySpec("rewinds per run; one more divergence stops it (exit 3)").Min(1));
    w.RejectUnknown();
  }
  r.RejectUnknown();
  return s;
}

static FaultInjectionConfig ReadFaultInjection(const ConfigReader& r) {
  FaultInjectionConfig f;
  const auto lr = r.Child("lr_multiplier_at_step",
                          "multiply the lr of the steps that train on these data batches (batch n is step n until a rewind skips some)");
  f.lr_multiplier_step = lr.Get("step", f.lr_multiplier_step, KeySpec("the first batch; 0 = off").Min(0));
  f.lr_multiplier_factor = lr.Get("factor", f.lr_multiplier_factor, KeySpec("the lr multiplier").Above(0));
  f.lr_multiplier_steps = lr.Get("steps", f.lr_multiplier_steps, KeySpec("batches from the first").Min(1));
  lr.RejectUnknown();
  f.nan_loss_at_step = r.Get("nan_loss_at_step", f.nan_loss_at_step,
                             KeySpec("make that step's loss (and gradients) NaN; 0 = off").Min(0));
  f.nan_loss_rank = r.Get("nan_loss_rank", f.nan_loss_rank, "... on that data-parallel rank only (-1: every rank)");
  f.stop_at_step = r.Get("stop_at_step", f.stop_at_step, KeySpec("act as if SIGINT arrived during that step; 0 = off").Min(0));
  f.kill_in_rewind = r.Get("kill_in_rewind", f.kill_in_rewind,
                           KeySpec("SIGKILL during the first rewind: 1 after the abandoned checkpoints go, 2 after the rewinds.jsonl row, 3 after the logs are cut back, 4 after the target is rewritten; 0 = off").Min(0).Max(4));
  r.RejectUnknown();
  return f;
}

TrainConfig TrainConfig::FromConfig(const ConfigReader& r) {
  TrainConfig t;
  t.steps = r.Get("steps", t.steps, KeySpec("optimizer steps").Above(0).Resumable());
  t.init_from = r.Get("init_from", t.init_from, "weights .h5 (converted HF or ours), a run directory (its latest checkpoint), or \"\" for scratch");
  t.init_std = r.Get("init_std", t.init_std, "normal init std from scratch");
  t.seed = r.Get("seed", t.seed, "the run seed: model init, and offsets data.seed and every kernel draw seed (0: as configured)");
  t.device = r.GetEnum("device", t.device, kTrainDeviceNames, KeySpec("where the run computes").Resumable());
  t.precision = r.GetEnum("precision", t.precision, kPrecisionNames,
                          "bf16_autocast: bf16 compute under autocast (CPU and CUDA), fp32 master weights, random features in fp32; eval and generate honour it");
  t.tf32 = r.Get("tf32", t.tf32, KeySpec("TF32 for fp32 matmuls on CUDA (Ampere and later): auto = on for CUDA runs; true on the CPU is refused").OneOf({"auto", "true", "false"}));
  t.peak_tflops = r.Get("peak_tflops", t.peak_tflops,
                        KeySpec("MFU's peak, TFLOP/s: 0 = a known GPU's dense bf16 peak (H100/H200 989, A100 312); none on a CPU").Min(0).Resumable());
  t.activation_checkpointing = r.Get("activation_checkpointing", t.activation_checkpointing,
                                     KeySpec("recompute each decoder layer in the backward (keeps only layer inputs): memory for about one more forward").Resumable());
  t.loss_chunk_tokens = r.Get("loss_chunk_tokens", t.loss_chunk_tokens,
                              KeySpec("cross-entropy this many tokens at a time, gradients in the forward: the full logits never exist").Min(0, "0 = the full-logit loss").Resumable());
  t.frozen_weights_bf16 = r.Get("frozen_weights_bf16", t.frozen_weights_bf16,
                                "frozen Linear weights (projections, MLP) stored in bf16; needs bf16_autocast; embedding, norms and kernels stay fp32");
  t.memory_check = r.Get("memory_check", t.memory_check,
                         KeySpec("refuse to start when the memory estimate exceeds the device's free memory (sizes that cannot fit are refused regardless)").Resumable());
  t.deterministic = r.Get(
      "deterministic", t.deterministic,
      KeySpec("deterministic algorithms (op: cuda adds dv without atomics), one thread, bit-exact resume").Resumable());
  t.threads = r.Get("threads", t.threads, KeySpec("CPU intra-op threads").Min(0, "0 = LibTorch's default").Resumable());
  t.lr = r.Get("lr", t.lr, KeySpec("AdamW's peak learning rate").Above(0));
  t.beta1 = r.Get("beta1", t.beta1, "AdamW beta1");
  t.beta2 = r.Get("beta2", t.beta2, "AdamW beta2");
  t.eps = r.Get("eps", t.eps, "AdamW epsilon");
  t.weight_decay = r.Get("weight_decay", t.weight_decay, "AdamW's decoupled weight decay");
  t.no_decay = r.Get("no_decay", t.no_decay, "parameter-name globs without weight decay");
  t.schedule = r.GetEnum("schedule", t.schedule, kLrScheduleNames, "learning-rate schedule (wsd: warmup-stable-decay)");
  t.warmup_steps = r.Get("warmup_steps", t.warmup_steps, KeySpec("linear warmup steps").Min(0));
  t.min_lr_ratio = r.Get("min_lr_ratio", t.min_lr_ratio, KeySpec("final lr / peak lr for cosine, linear and wsd").Min(0).Max(1));
  t.decay_fraction = r.Get("decay_fraction", t.decay_fraction, KeySpec("wsd: the final fraction of steps that decays").Min(0).Max(1));
  t.grad_clip = r.Get("grad_clip", t.grad_clip, KeySpec("max global grad norm").Min(0, "0 = off"));
  t.grad_accum = r.Get("grad_accum", t.grad_accum, KeySpec("micro-batches per optimizer step").Min(1));
  t.trainable = r.Get("trainable", t.trainable, KeySpec("parameter-name globs that train; the rest is frozen").NonEmpty());
  t.checkpoint_every = r.Get("checkpoint_every", t.checkpoint_every,
                             KeySpec("steps between checkpoints (one at the end always)").Min(0, "0 = at the end only").Resumable());
  t.keep_last = r.Get("keep_last", t.keep_last, KeySpec("checkpoints kept").Min(1).Resumable());
  t.spikes = ReadSpikes(r.Child("spikes", "loss-spike detection (docs/training.md)"));
  t.fault_injection = ReadFaultInjection(
      r.Child("fault_injection", KeySpec("test hooks only (tests/train): faults on purpose; 1-based steps, 0 = off").Resumable()));
  {
    const auto p = r.Child("profile", KeySpec("a Chrome trace of these optimizer steps in the run directory (LibTorch's Kineto profiler)").Resumable());
    t.profile.start_step = p.Get("start_step", t.profile.start_step, KeySpec("the first traced step").Min(1, "steps count from 1"));
    t.profile.steps = p.Get("steps", t.profile.steps, KeySpec("steps traced").Min(0, "0 = off"));
    p.RejectUnknown();
  }
  t.distributed = DistributedConfig::FromConfig(
      r.Child("distributed", KeySpec("only under torchrun (WORLD_SIZE > 1); docs/distributed.md").Resumable()));
  r.RejectUnknown();
  DF_CHECK(t.spikes.on_divergence != DivergenceAction::kRewind || t.checkpoint_every > 0,
           "config key '" << r.KeyPath("spikes.on_divergence") << "' is rewind, which needs checkpoints to rewind to: set '"
                          << r.KeyPath("checkpoint_every") << "' above 0 (it is 0: a checkpoint at the end only)");
  DF_CHECK(!t.frozen_weights_bf16 || t.precision == Precision::kBf16Autocast,
           "config key '" << r.KeyPath("frozen_weights_bf16") << "' needs train.precision: bf16_autocast (bf16 weights "
                          << "meet fp32 activations outside autocast)");
  return t;
}

EvalConfig EvalConfig::FromConfig(const ConfigReader& r) {
  EvalConfig e;
  e.every = r.Get("every", e.every, KeySpec("steps between evals (one at the end always)").Min(0, "0 = at the end only").Resumable());
  e.batches = r.Get("batches", e.batches, KeySpec("validation batches per eval (the same batches every time)").Min(1));
  r.RejectUnknown();
  return e;
}

LogConfig LogConfig::FromConfig(const ConfigReader& r) {
  LogConfig l;
  // A present but empty value (`dir:` or `--set log.dir=`) is not the default run directory.
  DF_CHECK(!(r.node().IsMap() && r.node()["dir"] && r.node()["dir"].IsNull()),
           "config key '" << r.KeyPath("dir") << "' must not be empty");
  l.dir = r.Get("dir", l.dir, KeySpec("the run directory").NonEmpty());
  l.every = r.Get("every", l.every, KeySpec("steps between progress lines (metrics.jsonl gets every step)").Min(0, "0 = no progress lines"));
  r.RejectUnknown();
  return l;
}

}  // namespace darkformer
