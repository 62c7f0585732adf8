// Packing rows from token shards (see packed_loader.h).
#include "data/packed_loader.h"

#include <algorithm>

#include "data/tokenizer.h"
#include "util/error.h"

namespace darkformer {

void CheckTokenizerMatches(const DatasetManifest& manifest, const std::string& shards_dir,
                           const TokenizerIdentity& configured, const std::string& key_path) {
  DF_CHECK(configured.SameAs(manifest.tokenizer),
           "tokenizer mismatch: config key '" << key_path << "' names a tokenizer with " << configured.Describe()
                                              << ", but the shards in " << shards_dir << " were made with "
                                              << manifest.tokenizer.Describe()
                                              << "; re-run prepare with the config's tokenizer or point '" << key_path
                                              << "' at the one the shards were made with");
}

void CheckShardsTokenizer(const DataConfig& config, const DatasetManifest& manifest) {
  if (config.tokenizer.empty()) {
    // Pre-tokenized shards have no tokenizer to compare; tokenized ones need the config to name theirs.
    DF_CHECK(manifest.tokenizer.IsPretokenized(),
             "config key '" << config.key_path << ".tokenizer' is required: the shards in " << config.shards_dir
                            << " were made with " << manifest.tokenizer.Describe());
  } else {
    CheckTokenizerMatches(manifest, config.shards_dir, Tokenizer(config.tokenizer).identity(),
                          config.key_path + ".tokenizer");
  }
}

PackedLoader::PackedLoader(const DataConfig& config, const std::string& split)
    : BatchSource(config, split), manifest_(DatasetManifest::Load(config.shards_dir)) {
  CheckShardsTokenizer(config, manifest_);
  DF_CHECK(!manifest_.labelled, config.shards_dir << " holds labelled records: read it with a LabelledLoader");
  dataset_ = std::make_unique<TokenDataset>(config.shards_dir, manifest_, split, config.bos_per_document);
  pad_id_ = manifest_.pad_id >= 0 ? manifest_.pad_id : manifest_.eos_id;
  const int64_t L = config.seq_len;
  if (config.packing == Packing::kConcat) {
    // Row r reads stream tokens [r L, r L + L + 1): L inputs and, shifted by one, L labels.
    SetNumRows(dataset_->stream_size() > 0 ? (dataset_->stream_size() - 1) / L : 0);
  } else {
    // Document d of framed length m takes ceil((m - 1) / L) rows: every token but its first is a
    // label exactly once, and a long document continues on the next row.
    row_prefix_.assign(dataset_->num_documents() + 1, 0);
    for (int64_t d = 0; d < dataset_->num_documents(); ++d) {
      int64_t m = dataset_->FramedSize(d);
      row_prefix_[d + 1] = row_prefix_[d] + (m - 1 + L - 1) / L;
    }
    SetNumRows(row_prefix_.back());
  }
  scratch_.resize(L + 1);
}

int64_t PackedLoader::vocab_size() const { return manifest_.tokenizer.vocab_size; }

std::string PackedLoader::Describe() const {
  return "token shards in " + config_.shards_dir + " (" + split_ + " split, tokenizer " + manifest_.tokenizer.Describe() +
         ")";
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

}  // namespace darkformer
