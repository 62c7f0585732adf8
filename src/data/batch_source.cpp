// Shuffling, rank slicing and position save/restore shared by every batch source (see
// batch_source.h).
#include "data/batch_source.h"

#include "data/index_permutation.h"
#include "util/config_reader.h"
#include "util/error.h"
#include "util/hashing.h"

namespace darkformer {

YAML::Node LoaderState::ToYaml() const {
  YAML::Node node;
  node["seed"] = seed;
  node["epoch"] = epoch;
  node["step"] = step;
  node["batches_per_epoch"] = batches_per_epoch;
  return node;
}

LoaderState LoaderState::FromYaml(const YAML::Node& node, const std::string& where) {
  LoaderState s;
  s.seed = RequiredField<uint64_t>(node, "seed", where);
  s.epoch = RequiredField<int64_t>(node, "epoch", where);
  s.step = RequiredField<int64_t>(node, "step", where);
  s.batches_per_epoch = RequiredField<int64_t>(node, "batches_per_epoch", where);
  return s;
}

BatchSource::BatchSource(const DataConfig& config, std::string split) : config_(config), split_(std::move(split)) {
  DF_CHECK(split_ == "train" || split_ == "val", "unknown data split '" << split_ << "' (train or val)");
}

void BatchSource::SetNumRows(int64_t num_rows) {
  num_rows_ = num_rows;
  config_.LocalBatchSize();  // throws when the ranks cannot split a global batch
  batches_per_epoch_ = num_rows_ / config_.batch_size;
  DF_CHECK(batches_per_epoch_ > 0, Describe() << " makes " << num_rows_ << " rows of " << config_.seq_len
                                              << " tokens, fewer than one global batch of " << config_.batch_size);
}

std::vector<int64_t> BatchSource::RowsOfBatch(int64_t epoch, int64_t step) const {
  // A fresh permutation per epoch: building one costs a few hashes, so nothing is cached.
  IndexPermutation permutation(static_cast<uint64_t>(num_rows_),
                               SplitMix64(config_.seed ^ SplitMix64(static_cast<uint64_t>(epoch))));
  // Global batch `step` is positions [step G, (step + 1) G) of the epoch's order (G = batch_size);
  // rank r takes the r-th of its W equal slices, so ranks never share a row and the W slices in
  // rank order are the batch one process would read.
  const int64_t B = config_.LocalBatchSize();
  const int64_t first = step * config_.batch_size + config_.rank * B;
  std::vector<int64_t> rows(B);
  for (int64_t b = 0; b < B; ++b) rows[b] = static_cast<int64_t>(permutation(static_cast<uint64_t>(first + b)));
  return rows;
}

Batch BatchSource::Next() {
  if (step_ == batches_per_epoch_) {
    ++epoch_;
    step_ = 0;
  }
  const int64_t B = config_.LocalBatchSize(), L = config_.seq_len;
  Batch batch;
  batch.input_ids_BL = torch::empty({B, L}, torch::kInt64);
  batch.labels_BL = torch::empty({B, L}, torch::kInt64);
  int64_t* inputs = batch.input_ids_BL.data_ptr<int64_t>();
  int64_t* labels = batch.labels_BL.data_ptr<int64_t>();
  const auto rows = RowsOfBatch(epoch_, step_);
  for (int64_t b = 0; b < B; ++b) FillRow(rows[b], inputs + b * L, labels + b * L);
  ++step_;
  return batch;
}

LoaderState BatchSource::state() const {
  LoaderState s;
  s.seed = config_.seed;
  s.epoch = epoch_;
  s.step = step_;
  s.batches_per_epoch = batches_per_epoch_;
  return s;
}

void BatchSource::Restore(const LoaderState& state) {
  DF_CHECK(state.seed == config_.seed, "data loader state was saved with seed "
                                           << state.seed << " but config key '" << config_.key_path
                                           << ".seed' is " << config_.seed);
  DF_CHECK(state.batches_per_epoch == batches_per_epoch_,
           "data loader state was saved by a loader with " << state.batches_per_epoch << " batches per epoch, this one has "
                                                           << batches_per_epoch_ << " (changed data, "
                                                           << config_.key_path << ".seq_len or batch_size?)");
  DF_CHECK(state.epoch >= 0 && state.step >= 0 && state.step <= batches_per_epoch_,
           "data loader state has an invalid position: epoch " << state.epoch << ", step " << state.step);
  epoch_ = state.epoch;
  step_ = state.step;
}

}  // namespace darkformer
