// Batches from token shards: fixed-length rows packed "concat" (documents joined into one stream)
// or "pad" (one document per row); shuffling, rank slices and position come from BatchSource.
//
// Shapes: B = batch_size rows per rank, L = seq_len.
#pragma once

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "data/data_config.h"
#include "data/shard_manifest.h"
#include "data/token_dataset.h"
#include "util/labels.h"

namespace darkformer {

// Throws unless `configured` (the config's tokenizer, named by `key_path`) is the tokenizer that
// made the shards in `shards_dir`; the error states both.
void CheckTokenizerMatches(const DatasetManifest& manifest, const std::string& shards_dir,
                           const TokenizerIdentity& configured, const std::string& key_path);

// Throws unless config.tokenizer agrees with the shards: it names theirs, or is empty for
// pre-tokenized shards.
void CheckShardsTokenizer(const DataConfig& config, const DatasetManifest& manifest);

class PackedLoader : public BatchSource {
 public:
  // Opens split "train" or "val" of config.shards_dir after checking config.tokenizer against it.
  explicit PackedLoader(const DataConfig& config, const std::string& split = "train");

  const DatasetManifest& manifest() const { return manifest_; }
  const TokenDataset& dataset() const { return *dataset_; }

  void FillRow(int64_t row, int64_t* inputs, int64_t* labels) const override;
  int64_t vocab_size() const override;
  std::string Describe() const override;
  int64_t document_separator() const override { return manifest_.eos_id; }

 private:
  DatasetManifest manifest_;
  std::unique_ptr<TokenDataset> dataset_;
  int64_t pad_id_ = 0;
  // "pad" packing: row_prefix_[d] is the first row of document d (size num_documents + 1).
  std::vector<int64_t> row_prefix_;
  mutable std::vector<int64_t> scratch_;
};

}  // namespace darkformer
