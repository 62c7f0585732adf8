// Where a run's batches come from. A source is a fixed set of rows (L input tokens and L aligned
// labels each); this base class owns what every source shares: a per-epoch seeded shuffle of the
// rows, disjoint slices for data-parallel ranks, and a position (LoaderState) that a checkpoint
// saves so a resumed run sees the same batches. Sources: token shards (PackedLoader) and the
// generated MQAR task (MqarSource); OpenBatchSource picks by `data.source` (and labelled shards,
// LabelledLoader, by their manifest).
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
#include "util/labels.h"

namespace darkformer {

struct Batch {
  torch::Tensor input_ids_BL;  // int64 [B, L]
  torch::Tensor labels_BL;     // int64 [B, L]: labels[t] is the target of position t, or kIgnoreIndex
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

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  // The next batch for this rank; after the last batch of an epoch the next epoch begins, with a
  // new shuffle.
  Batch Next();
  LoaderState state() const;
  // Continues from `state` (as saved by state()); throws if it came from a source with another
  // seed or epoch length.
  void Restore(const LoaderState& state);
  // The rows that batch `step` of `epoch` gives this rank, in order.
  std::vector<int64_t> RowsOfBatch(int64_t epoch, int64_t step) const;

  int64_t num_rows() const { return num_rows_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const std::string& split() const { return split_; }

  // Writes unshuffled row `row`: L inputs and L labels.
  virtual void FillRow(int64_t row, int64_t* inputs, int64_t* labels) const = 0;
  // Token ids lie in [0, vocab_size()): the model's vocabulary must hold them.
  virtual int64_t vocab_size() const = 0;
  // What the rows come from, for messages ("token shards in DIR (train split)").
  virtual std::string Describe() const = 0;
  // True for a benchmark's labelled records: `eval` scores one whole epoch (every record once)
  // unless told a batch count.
  virtual bool EvaluatedWhole() const { return false; }
  // The token that ends a document inside a row (EOS): the next position starts another one
  // (data.document_masking). -1: the source records none.
  virtual int64_t document_separator() const { return -1; }
  // Whether rows can hold several documents (token shards); false: one example per row (MQAR).
  virtual bool PacksDocuments() const { return true; }

 protected:
  BatchSource(const DataConfig& config, std::string split);
  // Sets the row count; throws (naming Describe()) when it makes no whole global batch.
  void SetNumRows(int64_t num_rows);

  DataConfig config_;
  std::string split_;

 private:
  int64_t num_rows_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
};

// The source `config.source` names, split "train" or "val"; nullptr for an empty "val" split.
std::unique_ptr<BatchSource> OpenBatchSource(const DataConfig& config, const std::string& split);
// As OpenBatchSource, for evaluation: labelled records are padded with empty rows (no labels) to
// whole global batches, so one epoch scores every record exactly once.
std::unique_ptr<BatchSource> OpenEvalSource(const DataConfig& config, const std::string& split);

}  // namespace darkformer
