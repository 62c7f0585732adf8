// Batches from labelled shards (`prepare --labelled`): one record per row, never packed with
// another, its inputs and labels as the benchmark gave them, padded to seq_len with the pad id
// and -100 labels. No BOS/EOS framing is added (data.packing and bos_per_document do not apply).
// A record longer than seq_len is an error naming its source file and line.
//
// Shapes: B = batch_size rows per rank, L = seq_len.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "data/label_shard.h"
#include "data/shard_manifest.h"
#include "data/token_shard_reader.h"

namespace darkformer {

class LabelledLoader : public BatchSource {
 public:
  // `pad_to_whole_batches`: add empty rows (no labels) up to a whole number of global batches, so
  // an epoch holds every record (evaluation); otherwise leftover rows of an epoch are dropped, as
  // for every other source (training).
  LabelledLoader(const DataConfig& config, const std::string& split, bool pad_to_whole_batches);

  int64_t num_records() const { return doc_prefix_.back(); }
  void FillRow(int64_t row, int64_t* inputs, int64_t* labels) const override;
  int64_t vocab_size() const override { return manifest_.tokenizer.vocab_size; }
  std::string Describe() const override;
  int64_t document_separator() const override { return manifest_.eos_id; }
  bool EvaluatedWhole() const override { return true; }

 private:
  struct Shard {
    std::unique_ptr<TokenShardReader> tokens;
    std::unique_ptr<LabelShardReader> labels;
  };

  DatasetManifest manifest_;
  std::vector<Shard> shards_;
  std::vector<int64_t> doc_prefix_{0};  // global index of each shard's first record
  int64_t pad_id_ = 0;
};

}  // namespace darkformer
