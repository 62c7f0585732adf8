// The trainer's step and eval lines and metrics.jsonl rows (see trainer.h): loss, lr, gradient
// norm, throughput with model FLOPs and MFU (train/model_flops.h), peak memory since the last row
// (train/step_memory.h), spike diagnostics.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "train/run_log.h"
#include "train/spike_monitor.h"
#include "train/trainer.h"

namespace darkformer {

void Trainer::StartThroughputAccounting() {
  flops_ = CountModelFlops(*model_, config_.data.seq_len);
  memory_ = std::make_unique<StepMemory>(device_);
  memory_->ReadAndReset();  // the peaks from here on
  const std::string name = memory_->DeviceName();
  peak_flops_ = PeakFlops(config_.train.peak_tflops, name);
  spdlog::info("model FLOPs per token {:.3g} (matmul weights {}, {} trainable; attention {:.3g} forward); MFU {}",
               flops_.per_token, flops_.matmul_weights, flops_.trainable_matmul_weights,
               flops_.attention_forward_per_token,
               peak_flops_ > 0 ? fmt::format("against {:.0f} TFLOP/s ({})", peak_flops_ / 1e12, name)
                               : std::string("not reported: set train.peak_tflops (no known peak for " + name + ")"));
}

void Trainer::LogStep(const StepResult& r) {
  const double tokens_per_s = static_cast<double>(r.tokens) / (r.step_ms / 1000.0);
  const auto& v = r.verdict;
  // This step's model FLOP/s per device (tokens are this rank's) and the memory peaks since the last row.
  const double mfu = peak_flops_ > 0 ? flops_.per_token * tokens_per_s / peak_flops_ : 0.0;
  if (peak_flops_ > 0) {
    mfu_sum_ += mfu;
    ++mfu_steps_;
  }
  const auto peaks = memory_->ReadAndReset();
  const int64_t device_peak = peaks.cuda_allocated >= 0 ? peaks.cuda_allocated : peaks.rss;
  run_peak_memory_ = std::max(run_peak_memory_, device_peak);
  line_peak_memory_ = std::max(line_peak_memory_, device_peak);
  Json row = {{"type", "train"}, {"step", state_.step}, {"tokens_seen", state_.tokens_seen}, {"loss", r.loss},
              {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_s}, {"step_ms", r.step_ms},
              {"flops_per_token", flops_.per_token}, {"loss_z", v.loss_z}, {"grad_norm_z", v.grad_norm_z},
              {"peak_rss_bytes", peaks.rss}, {"spike", v.spike}, {"skipped", r.skipped}};
  row["mfu"] = peak_flops_ > 0 ? Json(mfu) : Json(nullptr);
  if (peaks.cuda_allocated >= 0) {
    row["cuda_allocated_peak_bytes"] = peaks.cuda_allocated;
    row["cuda_reserved_peak_bytes"] = peaks.cuda_reserved;
  }
  log_->Metrics(row);
  if (v.spike) {
    Json layers = Json::array();
    for (const auto& a : r.attention) {
      layers.push_back({{"layer", a.layer}, {"kernel", a.kernel}, {"max_logit", a.max_logit},
                        {"max_log_feature", a.max_log_feature}});
    }
    log_->Spike({{"step", state_.step}, {"loss", r.loss}, {"window_mean", v.loss_mean}, {"window_std", v.loss_std},
                 {"z", v.loss_z}, {"grad_norm", r.grad_norm}, {"grad_norm_z", v.grad_norm_z},
                 {"loss_ratio_to_min", v.loss_ratio_to_min}, {"lr", r.lr}, {"reason", v.reason},
                 {"skipped", r.skipped}, {"layers", layers}});
  }
  const auto& t = config_.train;
  if (config_.log.every > 0 && (state_.step % config_.log.every == 0 || state_.step == t.steps)) {
    const double remaining_s = r.step_ms / 1000.0 * static_cast<double>(t.steps - state_.step);
    spdlog::info("step {:>6}/{} | loss {:.4f} (z {:+.1f}) | norm {:.3f} (z {:+.1f}) | lr {:.2e} | {:.0f} ms | "
                 "{:.0f} tok/s{} | mem {:.2f} GiB | ETA {:.0f}s{}",
                 state_.step, t.steps, r.loss, v.loss_z, r.grad_norm, v.grad_norm_z, r.lr, r.step_ms, tokens_per_s,
                 peak_flops_ > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : std::string(),
                 static_cast<double>(line_peak_memory_) / (1 << 30), remaining_s, v.spike ? " | SPIKE " + v.reason : "");
    line_peak_memory_ = 0;
  }
}

void Trainer::LogEval(const EvalResult& r) {
  log_->Metrics({{"type", "eval"}, {"step", state_.step}, {"tokens_seen", state_.tokens_seen}, {"loss", r.loss},
                 {"perplexity", r.perplexity}, {"accuracy", r.accuracy}, {"tokens", r.tokens}});
  spdlog::info("eval @ {}: loss {:.4f} | ppl {:.2f} | next-token accuracy {:.4f} | {} tokens", state_.step, r.loss,
               r.perplexity, r.accuracy, r.tokens);
}

}  // namespace darkformer
