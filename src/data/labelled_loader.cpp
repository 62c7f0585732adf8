// Rows of labelled records (see labelled_loader.h).
#include "data/labelled_loader.h"

#include <algorithm>
#include <filesystem>

#include "data/packed_loader.h"
#include "util/error.h"
#include "util/labels.h"

namespace darkformer {

LabelledLoader::LabelledLoader(const DataConfig& config, const std::string& split, bool pad_to_whole_batches)
    : BatchSource(config, split), manifest_(DatasetManifest::Load(config.shards_dir)) {
  CheckShardsTokenizer(config, manifest_);
  DF_CHECK(manifest_.labelled, config.shards_dir << " holds no labels: prepare it with --labelled");
  for (const auto& record : manifest_.shards) {
    const ShardSplit& part = split == "val" ? record.val : record.train;
    if (part.documents == 0) continue;
    // Rows are not continued, so every record must fit one; the manifest knows the longest.
    DF_CHECK(part.longest <= config.seq_len,
             record.source << ":" << part.longest_line << ": record of " << part.longest << " tokens is longer than "
                           << config.key_path << ".seq_len = " << config.seq_len
                           << " (labelled records are neither packed nor split)");
    const std::string stem = (std::filesystem::path(config.shards_dir) / part.stem).string();
    Shard shard;
    shard.tokens = std::make_unique<TokenShardReader>(stem);
    DF_CHECK(shard.tokens->num_documents() == part.documents && shard.tokens->num_tokens() == part.tokens,
             stem << ": holds " << shard.tokens->num_documents() << " records and " << shard.tokens->num_tokens()
                  << " tokens, but the manifest says " << part.documents << " and " << part.tokens);
    shard.labels = std::make_unique<LabelShardReader>(stem, part.tokens);
    doc_prefix_.push_back(doc_prefix_.back() + part.documents);
    shards_.push_back(std::move(shard));
  }
  pad_id_ = manifest_.pad_id >= 0 ? manifest_.pad_id : std::max(manifest_.eos_id, 0);
  int64_t rows = num_records();
  if (pad_to_whole_batches) rows = (rows + config.batch_size - 1) / config.batch_size * config.batch_size;
  SetNumRows(rows);
}

std::string LabelledLoader::Describe() const {
  return "labelled records in " + config_.shards_dir + " (" + split_ + " split, " + std::to_string(num_records()) +
         " records)";
}

void LabelledLoader::FillRow(int64_t row, int64_t* inputs, int64_t* labels) const {
  const int64_t L = config_.seq_len;
  std::fill(inputs, inputs + L, pad_id_);
  std::fill(labels, labels + L, kIgnoreIndex);
  if (row >= num_records()) return;  // an empty row padding the last batch
  const size_t s = std::upper_bound(doc_prefix_.begin(), doc_prefix_.end(), row) - doc_prefix_.begin() - 1;
  const Shard& shard = shards_[s];
  const int64_t d = row - doc_prefix_[s];
  const int64_t begin = shard.tokens->doc_begin(d), count = shard.tokens->doc_size(d);
  shard.tokens->CopyTokens(begin, count, inputs);
  shard.labels->CopyLabels(begin, count, labels);
}

}  // namespace darkformer
