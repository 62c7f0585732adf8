// Packing, shuffling, rank slicing and position save/restore (see packed_loader.h).
#include "data/packed_loader.h"

#include <algorithm>

#include "util/hashing.h"
#include "data/index_permutation.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace darkformer {
namespace {

template <typename T>
T StateField(const YAML::Node& node, const char* key, const std::string& where) {
  DF_CHECK(node.IsMap() && node[key], where << ": data loader state lacks '" << key << "'");
  try {
    return node[key].as<T>();
  } catch (const YAML::Exception& e) {
    Fail(where + ": data loader state '" + key + "' has the wrong type: " + e.what());
  }
}

}  // namespace

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
  s.seed = StateField<uint64_t>(node, "seed", where);
  s.epoch = StateField<int64_t>(node, "epoch", where);
  s.step = StateField<int64_t>(node, "step", where);
  s.batches_per_epoch = StateField<int64_t>(node, "batches_per_epoch", where);
  return s;
}

void CheckTokenizerMatches(const DatasetManifest& manifest, const std::string& shards_dir,
                           const TokenizerIdentity& configured, const std::string& key_path) {
  DF_CHECK(configured.SameAs(manifest.tokenizer),
           "tokenizer mismatch: config key '" << key_path << "' names a tokenizer with " << configured.Describe()
                                              << ", but the shards in " << shards_dir << " were made with "
                                              << manifest.tokenizer.Describe()
                                              << "; re-run prepare with the config's tokenizer or point '" << key_path
                                              << "' at the one the shards were made with");
}

PackedLoader::PackedLoader(const DataConfig& config, const std::string& split)
    : config_(config), split_(split), manifest_(DatasetManifest::Load(config.shards_dir)) {
  CheckTokenizerMatches(manifest_, config.shards_dir, Tokenizer(config.tokenizer).identity(),
                        config.key_path + ".tokenizer");
  dataset_ = std::make_unique<TokenDataset>(config.shards_dir, manifest_, split, config.bos_per_document);
  pad_id_ = manifest_.pad_id >= 0 ? manifest_.pad_id : manifest_.eos_id;
  const int64_t L = config.seq_len;
  if (config.packing == Packing::kConcat) {
    // Row r reads stream tokens [r L, r L + L + 1): L inputs and, shifted by one, L labels.
    num_rows_ = dataset_->stream_size() > 0 ? (dataset_->stream_size() - 1) / L : 0;
  } else {
    // Document d of framed length m takes ceil((m - 1) / L) rows: every token but its first is a
    // label exactly once, and a long document continues on the next row.
    row_prefix_.assign(dataset_->num_documents() + 1, 0);
    for (int64_t d = 0; d < dataset_->num_documents(); ++d) {
      int64_t m = dataset_->FramedSize(d);
      row_prefix_[d + 1] = row_prefix_[d] + (m - 1 + L - 1) / L;
    }
    num_rows_ = row_prefix_.back();
  }
  const int64_t global_batch = config.batch_size * config.world_size;
  batches_per_epoch_ = num_rows_ / global_batch;
  DF_CHECK(batches_per_epoch_ > 0, config.shards_dir << " (" << split << " split) makes " << num_rows_ << " rows of "
                                                     << L << " tokens, fewer than one global batch of "
                                                     << config.batch_size << " x " << config.world_size << " ranks");
  scratch_.resize(L + 1);
}

void PackedLoader::FillRow(int64_t row, int64_t* inputs, int64_t* labels) const {
  const int64_t L = config_.seq_len;
  if (config_.packing == Packing::kConcat) {
    dataset_->CopyStream(row * L, L + 1, scratch_.data());
    std::copy(scratch_.begin(), scratch_.begin() + L, inputs);
    std::copy(scratch_.begin() + 1, scratch_.begin() + L + 1, labels);
    return;
  }
  int64_t d = std::upper_bound(row_prefix_.begin(), row_prefix_.end(), row) - row_prefix_.begin() - 1;
  int64_t start = (row - row_prefix_[d]) * L;
  int64_t count = std::min(L + 1, dataset_->FramedSize(d) - start);
  dataset_->CopyFramed(d, start, count, scratch_.data());
  for (int64_t i = 0; i < L; ++i) {
    inputs[i] = i < count ? scratch_[i] : pad_id_;
    labels[i] = i + 1 < count ? scratch_[i + 1] : kIgnoreIndex;
  }
}

std::vector<int64_t> PackedLoader::RowsOfBatch(int64_t epoch, int64_t step) const {
  // A fresh permutation per epoch: building one costs a few hashes, so nothing is cached.
  IndexPermutation permutation(static_cast<uint64_t>(num_rows_),
                               SplitMix64(config_.seed ^ SplitMix64(static_cast<uint64_t>(epoch))));
  // Global batch `step` is positions [step B W, (step + 1) B W) of the epoch's order; rank r takes
  // its own B of them, so ranks never share a row.
  const int64_t B = config_.batch_size;
  const int64_t first = (step * config_.world_size + config_.rank) * B;
  std::vector<int64_t> rows(B);
  for (int64_t b = 0; b < B; ++b) rows[b] = static_cast<int64_t>(permutation(static_cast<uint64_t>(first + b)));
  return rows;
}

Batch PackedLoader::Next() {
  if (step_ == batches_per_epoch_) {
    ++epoch_;
    step_ = 0;
  }
  const int64_t B = config_.batch_size, L = config_.seq_len;
  Batch batch;
  batch.input_ids_BL = torch::empty({B, L}, torch::kInt64);
  batch.labels_BL = torch::empty({B, L}, torch::kInt64);
  int64_t* inputs = batch.input_ids_BL.data_ptr<int64_t>();
  int64_t* labels = batch.labels_BL.data_ptr<int64_t>();
  std::vector<int64_t> rows = RowsOfBatch(epoch_, step_);
  for (int64_t b = 0; b < B; ++b) FillRow(rows[b], inputs + b * L, labels + b * L);
  ++step_;
  return batch;
}

LoaderState PackedLoader::state() const {
  LoaderState s;
  s.seed = config_.seed;
  s.epoch = epoch_;
  s.step = step_;
  s.batches_per_epoch = batches_per_epoch_;
  return s;
}

void PackedLoader::Restore(const LoaderState& state) {
  DF_CHECK(state.seed == config_.seed, "data loader state was saved with seed "
                                           << state.seed << " but config key '" << config_.key_path
                                           << ".seed' is " << config_.seed);
  DF_CHECK(state.batches_per_epoch == batches_per_epoch_,
           "data loader state was saved by a loader with " << state.batches_per_epoch << " batches per epoch, this one has "
                                                           << batches_per_epoch_ << " (changed shards, "
                                                           << config_.key_path << ".seq_len, batch_size or world_size?)");
  DF_CHECK(state.epoch >= 0 && state.step >= 0 && state.step <= batches_per_epoch_,
           "data loader state has an invalid position: epoch " << state.epoch << ", step " << state.step);
  epoch_ = state.epoch;
  step_ = state.step;
}

}  // namespace darkformer
