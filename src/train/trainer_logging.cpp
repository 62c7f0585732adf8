// The trainer's step and eval lines and metrics.jsonl rows (see trainer.h): loss, lr, gradient
// norm, throughput, MFU and peak memory since the last row (train/step_metrics.h), spike
// diagnostics, and nonfinite.json (the batch position of a non-finite step that stops the run).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "train/run_log.h"
#include "train/spike_monitor.h"
#include "train/trainer.h"

namespace darkformer {

void Trainer::LogStep(const StepResult& r) {
  const auto& v = r.verdict;
  const auto measured = metrics_->Measure(r.tokens, r.step_ms);
  const double tokens_per_s = measured.tokens_per_s, mfu = measured.mfu;
  const auto& peaks = measured.peaks;
  Json row = {{"type", "train"}, {"step", state_.step}, {"tokens_seen", state_.tokens_seen}, {"loss", r.loss},
              {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_s}, {"step_ms", r.step_ms},
              {"flops_per_token", metrics_->flops().per_token}, {"loss_z", v.loss_z}, {"grad_norm_z", v.grad_norm_z},
              {"peak_rss_bytes", peaks.rss}, {"spike", v.spike}, {"skipped", r.skipped}};
  row["mfu"] = metrics_->has_mfu() ? Json(mfu) : Json(nullptr);
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
                 metrics_->has_mfu() ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : std::string(),
                 static_cast<double>(metrics_->TakeLinePeak()) / (1 << 30), remaining_s,
                 v.spike ? " | SPIKE " + v.reason : "");
  }
}

void Trainer::LogEval(const EvalResult& r) {
  log_->Metrics({{"type", "eval"}, {"step", state_.step}, {"tokens_seen", state_.tokens_seen}, {"loss", r.loss},
                 {"perplexity", r.perplexity}, {"accuracy", r.accuracy}, {"tokens", r.tokens}});
  spdlog::info("eval @ {}: loss {:.4f} | ppl {:.2f} | next-token accuracy {:.4f} | {} tokens", state_.step, r.loss,
               r.perplexity, r.accuracy, r.tokens);
}

void Trainer::WriteNonfinite(const StepResult& step) {
  if (!log_) return;  // rank 0 writes the run directory
  const auto& position = step.position;
  std::vector<int64_t> rows;  // unshuffled row indices of every micro-batch (BatchSource::FillRow)
  for (int64_t micro = 0; micro < config_.train.grad_accum; ++micro) {
    const int64_t per_epoch = train_loader_->batches_per_epoch();
    const int64_t batch = position.step + micro;
    for (const auto row : train_loader_->RowsOfBatch(position.epoch + batch / per_epoch, batch % per_epoch)) {
      rows.push_back(row);
    }
  }
  // The position before the step took its batches: restoring it replays the offending batch.
  const int64_t this_step = state_.step + 1;
  log_->Nonfinite({{"step", this_step}, {"loss", step.loss}, {"grad_norm", step.grad_norm},
                   {"loader_seed", position.seed}, {"loader_epoch", position.epoch},
                   {"loader_step", position.step}, {"grad_accum", config_.train.grad_accum}, {"rows", rows}});
  spdlog::error("stopping on a non-finite loss at step {}; the batch position is in {}", this_step,
                log_->Path("nonfinite.json"));
}

}  // namespace darkformer
