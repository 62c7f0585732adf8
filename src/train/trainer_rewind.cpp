// train.spikes.on_divergence: declaring divergence and rewinding (see trainer.h, train/rewind.h).
// A rewind is ordered so that a kill -9 at any moment resumes to the same run: first the
// checkpoints of the abandoned steps go (a resume then starts at the target and, the run being
// deterministic, replays to this same rewind), then rewinds.jsonl gets its row (dropped again on
// a resume that has not counted the rewind), and last the target's checkpoint is written again
// with the skipped data position and the rewind counted.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "train/rewind.h"
#include "train/trainer.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

Json Position(const LoaderState& s) { return {{"epoch", s.epoch}, {"step", s.step}, {"micro_batches", MicroBatchesRead(s)}}; }

}  // namespace

Trainer::AfterDivergence Trainer::HandleDivergence(const StepResult& step) {
  const auto& s = config_.train.spikes;
  if (s.on_divergence == DivergenceAction::kContinue) return AfterDivergence::kGoOn;  // the detector is not even asked
  const auto found = divergence_->Observe(state_.step, step.verdict.spike, step.skipped, step.finite);
  // Every rank saw the same all-reduced loss and grad norm; a disagreement is a broken replica.
  DF_CHECK(AnyRank(found.has_value(), "agreeing on a divergence") == found.has_value(),
           "data-parallel ranks disagree on whether step " << state_.step << " diverged");
  if (!found) return AfterDivergence::kGoOn;
  const auto& d = *found;
  if (s.on_divergence == DivergenceAction::kStop) {
    spdlog::error("diverged at step {} ({}; first bad step {}): stopping (train.spikes.on_divergence: stop)",
                  d.declared_at, d.rule, d.first_bad);
    return AfterDivergence::kStop;
  }
  if (state_.rewinds >= s.rewind.max_rewinds) {
    spdlog::error("diverged at step {} ({}) after {} rewind(s), the most train.spikes.rewind.max_rewinds allows: "
                  "stopping", d.declared_at, d.rule, state_.rewinds);
    return AfterDivergence::kStop;
  }
  const auto target = RewindTarget(ListCheckpoints(config_.log.dir), d.first_bad, s.rewind.min_steps_back);
  if (!target) {
    spdlog::error("diverged at step {} ({}), but no checkpoint is {} or more steps before its first bad step {}: "
                  "stopping (lower train.checkpoint_every or train.spikes.rewind.min_steps_back)",
                  d.declared_at, d.rule, s.rewind.min_steps_back + 1, d.first_bad);
    return AfterDivergence::kStop;
  }
  Rewind(d, *target);
  return AfterDivergence::kRewound;
}

void Trainer::Rewind(const Divergence& d, const std::pair<int64_t, std::string>& target) {
  const auto& w = config_.train.spikes.rewind;
  const int64_t accum = config_.train.grad_accum;
  const auto& [to_step, path] = target;
  const TrainerState before = state_;
  const LoaderState read_to = train_loader_->state();  // after the declaring step's batches
  if (is_rank_zero()) {
    for (const auto& [step, file] : ListCheckpoints(config_.log.dir)) {
      if (step > to_step) fs::remove(file);
    }
  }
  if (is_rank_zero()) faults_->AtRewindPhase(1, before.rewinds);
  replicas_->Barrier("removing the checkpoints after step " + std::to_string(to_step));

  state_ = LoadCheckpoint(path, *model_, *optimizer_);
  spikes_->Restore(state_.spike_window);
  divergence_->Restore(state_.divergence);
  const LoaderState from = state_.loader;
  const LoaderState resume_at = AdvancedBy(read_to, w.skip_batches * accum);
  train_loader_->Restore(resume_at);
  const int64_t skipped = (MicroBatchesRead(resume_at) - MicroBatchesRead(from)) / accum;
  state_.rewinds = before.rewinds + 1;
  state_.batches_skipped = before.batches_skipped + skipped;
  state_.lr_factor_until = to_step + w.lr_steps;
  state_.wall_seconds = before.wall_seconds;

  if (log_) {
    log_->Rewind({{"rewind", state_.rewinds}, {"step", d.declared_at}, {"from_step", d.declared_at},
                  {"to_step", to_step}, {"checkpoint", path}, {"rule", d.rule}, {"first_bad_step", d.first_bad},
                  {"batches_skipped", skipped}, {"data_at_checkpoint", Position(from)}, {"data_read", Position(read_to)},
                  {"data_resumes_at", Position(resume_at)}, {"lr_factor", w.lr_factor},
                  {"lr_factor_until_step", state_.lr_factor_until},
                  {"spikes", log_->SpikesBetween(d.first_bad, d.declared_at)}});
    faults_->AtRewindPhase(2, before.rewinds);
    log_->OpenAfterStep(to_step, state_.rewinds);  // the abandoned steps' lines go; they run again
    faults_->AtRewindPhase(3, before.rewinds);
  }
  spdlog::warn("diverged at step {} ({}; first bad step {}): rewind {} of at most {} to the checkpoint of step {}, "
               "skipping {} batches (data resumes at epoch {}, batch {}){}",
               d.declared_at, d.rule, d.first_bad, state_.rewinds, w.max_rewinds, to_step, skipped, resume_at.epoch,
               resume_at.step, w.lr_steps > 0 ? fmt::format("; lr x {} until step {}", w.lr_factor, state_.lr_factor_until)
                                              : std::string());
  // All ranks have loaded it before rank 0 writes it again.
  replicas_->Barrier("loading the checkpoint of step " + std::to_string(to_step));
  if (is_rank_zero()) {
    WriteCheckpoint();
    faults_->AtRewindPhase(4, before.rewinds);
  }
  replicas_->Barrier("waiting for rank 0's rewound checkpoint of step " + std::to_string(to_step));
}

}  // namespace darkformer
