// Framed-document view over memory-mapped token shards (see token_dataset.h).
#include "data/token_dataset.h"

#include <algorithm>
#include <filesystem>

#include "util/error.h"

namespace darkformer {

TokenDataset::TokenDataset(const std::string& shards_dir, const DatasetManifest& manifest, const std::string& split,
                           bool bos_per_document)
    : bos_(bos_per_document), bos_id_(manifest.bos_id), eos_id_(manifest.eos_id) {
  DF_CHECK(split == "train" || split == "val", "unknown data split '" << split << "' (train or val)");
  DF_CHECK(!bos_ || bos_id_ >= 0, shards_dir << ": the shards record no BOS id (the tokenizer has none), so "
                                             "bos_per_document must be false; or re-run prepare with --bos-id");
  DF_CHECK(eos_id_ >= 0, shards_dir << ": the shards record no EOS id");
  for (const auto& record : manifest.shards) {
    const ShardSplit& part = split == "val" ? record.val : record.train;
    if (part.documents == 0) continue;
    std::string stem = (std::filesystem::path(shards_dir) / part.stem).string();
    auto reader = std::make_unique<TokenShardReader>(stem);
    DF_CHECK(reader->num_documents() == part.documents && reader->num_tokens() == part.tokens,
             stem << ": holds " << reader->num_documents() << " documents and " << reader->num_tokens()
                  << " tokens, but the manifest says " << part.documents << " and " << part.tokens);
    DF_CHECK(reader->bytes_per_token() == manifest.bytes_per_token,
             stem << ": " << reader->bytes_per_token() << " bytes per token, manifest says "
                  << manifest.bytes_per_token);
    num_tokens_ += reader->num_tokens();
    doc_prefix_.push_back(doc_prefix_.back() + reader->num_documents());
    stream_prefix_.push_back(stream_prefix_.back() + reader->num_tokens() + reader->num_documents() * frame());
    shards_.push_back(std::move(reader));
  }
}

void TokenDataset::CopyLocalFramed(size_t s, int64_t d, int64_t offset, int64_t count, int64_t* out) const {
  const TokenShardReader& shard = *shards_[s];
  const int64_t n = shard.doc_size(d);
  int64_t pos = offset;
  const int64_t end = offset + count;
  if (bos_ && pos == 0 && pos < end) {
    *out++ = bos_id_;
    ++pos;
  }
  const int64_t first = bos_ ? 1 : 0;  // framed position of the first real token
  if (pos < end && pos - first < n) {
    int64_t take = std::min(end, first + n) - pos;
    shard.CopyTokens(shard.doc_begin(d) + pos - first, take, out);
    out += take;
    pos += take;
  }
  if (pos < end) {
    DF_CHECK(pos == first + n && end == pos + 1, "framed copy past the end of a document");
    *out = eos_id_;
  }
}

int64_t TokenDataset::FramedSize(int64_t doc) const {
  size_t s = std::upper_bound(doc_prefix_.begin(), doc_prefix_.end(), doc) - doc_prefix_.begin() - 1;
  return shards_[s]->doc_size(doc - doc_prefix_[s]) + frame();
}

void TokenDataset::CopyFramed(int64_t doc, int64_t offset, int64_t count, int64_t* out) const {
  size_t s = std::upper_bound(doc_prefix_.begin(), doc_prefix_.end(), doc) - doc_prefix_.begin() - 1;
  CopyLocalFramed(s, doc - doc_prefix_[s], offset, count, out);
}

void TokenDataset::CopyStream(int64_t begin, int64_t count, int64_t* out) const {
  DF_CHECK(begin >= 0 && count >= 0 && begin + count <= stream_size(),
           "stream range [" << begin << ", " << begin + count << ") is outside [0, " << stream_size() << ")");
  if (count == 0) return;
  size_t s = std::upper_bound(stream_prefix_.begin(), stream_prefix_.end(), begin) - stream_prefix_.begin() - 1;
  int64_t local = begin - stream_prefix_[s];
  // The last document of shard s whose framed start is <= local: binary search over d, using
  // that LocalStreamStart is monotonic.
  int64_t lo = 0, hi = shards_[s]->num_documents() - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (LocalStreamStart(s, mid) <= local) lo = mid;
    else hi = mid - 1;
  }
  int64_t d = lo;
  int64_t offset = local - LocalStreamStart(s, d);
  while (count > 0) {
    int64_t framed = shards_[s]->doc_size(d) + frame();
    int64_t take = std::min(count, framed - offset);
    CopyLocalFramed(s, d, offset, take, out);
    out += take;
    count -= take;
    offset = 0;
    if (++d == shards_[s]->num_documents()) {
      ++s;
      d = 0;
    }
  }
}

}  // namespace darkformer
