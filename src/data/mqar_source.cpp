// MQAR batches (see mqar_source.h) and the factory that picks a run's batch source.
#include "data/mqar_source.h"

#include <algorithm>

#include "data/labelled_loader.h"
#include "data/packed_loader.h"
#include "util/error.h"

namespace darkformer {

MqarSource::MqarSource(const DataConfig& config, const std::string& split) : BatchSource(config, split) {
  auto task = config.mqar.task;
  task.seq_len = config.seq_len;
  if (split == "val") task.seed = config.mqar.val_seed;
  task.Check("mqar");
  task_ = task;
  gap_p_ = MqarGapProbabilities(task_);
  // Rows are made when a batch asks for them: the set is never held, whatever train_examples says.
  SetNumRows(split == "val" ? config.mqar.val_examples : config.mqar.train_examples);
}

void MqarSource::FillRow(int64_t row, int64_t* inputs, int64_t* labels) const {
  WriteMqarExample(task_, gap_p_, row, inputs, labels);
}

std::string MqarSource::Describe() const {
  const auto& m = config_.mqar;
  return "MQAR task (" + split_ + " split: " + std::to_string(num_rows()) + " examples, vocab " +
         std::to_string(m.task.vocab_size) + ", " + std::to_string(m.task.num_kv_pairs) + " key-value pairs, seq_len " +
         std::to_string(config_.seq_len) + ", seed " + std::to_string(split_ == "val" ? m.val_seed : m.task.seed) + ")";
}

std::unique_ptr<BatchSource> OpenBatchSource(const DataConfig& config, const std::string& split) {
  if (config.source == DataSource::kMqar) {
    if (split == "val" && config.mqar.val_examples == 0) return nullptr;
    return std::make_unique<MqarSource>(config, split);
  }
  const DatasetManifest manifest = DatasetManifest::Load(config.shards_dir);
  if (split == "val" && manifest.TotalDocuments(/*val=*/true) == 0) return nullptr;
  if (manifest.labelled) return std::make_unique<LabelledLoader>(config, split, /*pad_to_whole_batches=*/false);
  return std::make_unique<PackedLoader>(config, split);
}

std::unique_ptr<BatchSource> OpenEvalSource(const DataConfig& config, const std::string& split) {
  if (config.source != DataSource::kShards) return OpenBatchSource(config, split);
  const DatasetManifest manifest = DatasetManifest::Load(config.shards_dir);
  if (!manifest.labelled) return OpenBatchSource(config, split);
  if (split == "val" && manifest.TotalDocuments(/*val=*/true) == 0) return nullptr;
  return std::make_unique<LabelledLoader>(config, split, /*pad_to_whole_batches=*/true);
}

}  // namespace darkformer
