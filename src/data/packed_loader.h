// The training data loader: fixed-length rows packed from token shards ("concat" or "pad"),
// shuffled per epoch by seed, sliced disjointly across data-parallel ranks, with a position
// (LoaderState) that a checkpoint saves so a resumed run sees the same batches.
//
// Shapes: B = batch_size rows per rank, L = seq_len.
#pragma once

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/data_config.h"
#include "data/shard_manifest.h"
#include "data/token_dataset.h"
#include "util/labels.h"

namespace darkformer {

struct Batch {
  torch::Tensor input_ids_BL;  // int64 [B, L]
  torch::Tensor labels_BL;     // int64 [B, L]: the next token, or kIgnoreIndex
};

// The loader's exact position. The trainer stores ToYaml() in its checkpoint.
struct LoaderState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t step = 0;               // batches already taken in this epoch
  int64_t batches_per_epoch = 0;  // of the loader that saved it; checked on restore

  YAML::Node ToYaml() const;
  // `where` names the checkpoint file or key, for errors.
  static LoaderState FromYaml(const YAML::Node& node, const std::string& where);
  bool operator==(const LoaderState& o) const {
    return seed == o.seed && epoch == o.epoch && step == o.step && batches_per_epoch == o.batches_per_epoch;
  }
};

// Throws unless `configured` (the config's tokenizer, named by `key_path`) is the tokenizer that
// made the shards in `shards_dir`; the error states both.
void CheckTokenizerMatches(const DatasetManifest& manifest, const std::string& shards_dir,
                           const TokenizerIdentity& configured, const std::string& key_path);

class PackedLoader {
 public:
  // Opens split "train" or "val" of config.shards_dir after checking config.tokenizer against it.
  explicit PackedLoader(const DataConfig& config, const std::string& split = "train");

  // The next batch for this rank; after the last batch of an epoch the next epoch begins, with a
  // new shuffle.
  Batch Next();

  LoaderState state() const;
  // Continues from `state` (as saved by state()); throws if it came from a loader with another
  // seed or epoch length.
  void Restore(const LoaderState& state);

  int64_t num_rows() const { return num_rows_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const DatasetManifest& manifest() const { return manifest_; }
  const TokenDataset& dataset() const { return *dataset_; }

  // Writes unshuffled row `row` (inputs and labels, L each); for tests and inspection.
  void FillRow(int64_t row, int64_t* inputs, int64_t* labels) const;
  // The rows that batch `step` of `epoch` gives this rank, in order.
  std::vector<int64_t> RowsOfBatch(int64_t epoch, int64_t step) const;

 private:

  DataConfig config_;
  std::string split_;
  DatasetManifest manifest_;
  std::unique_ptr<TokenDataset> dataset_;
  int64_t pad_id_ = 0;
  int64_t num_rows_ = 0;
  int64_t batches_per_epoch_ = 0;
  // "pad" packing: row_prefix_[d] is the first row of document d (size num_documents + 1).
  std::vector<int64_t> row_prefix_;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
  mutable std::vector<int64_t> scratch_;
};

}  // namespace darkformer
