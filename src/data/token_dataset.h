// One split ("train" or "val") of prepared token shards, memory-mapped, with every document framed
// as [BOS] tokens EOS. Offers the framed documents one by one and as one concatenated stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shard_manifest.h"
#include "data/token_shard_reader.h"

namespace darkformer {

class TokenDataset {
 public:
  // Maps the shards of `split` that `manifest` (read from `shards_dir`) lists; a shard whose files
  // disagree with the manifest is an error naming the file.
  TokenDataset(const std::string& shards_dir, const DatasetManifest& manifest, const std::string& split,
               bool bos_per_document);

  int64_t num_documents() const { return doc_prefix_.back(); }
  int64_t num_tokens() const { return num_tokens_; }  // unframed
  // Framed tokens in all documents, one after the other.
  int64_t stream_size() const { return stream_prefix_.back(); }
  // Framed length of global document `doc`: its tokens plus BOS (when configured) and EOS.
  int64_t FramedSize(int64_t doc) const;
  // Copies framed tokens [offset, offset + count) of global document `doc` to `out`.
  void CopyFramed(int64_t doc, int64_t offset, int64_t count, int64_t* out) const;
  // Copies tokens [begin, begin + count) of the stream of all framed documents to `out`.
  void CopyStream(int64_t begin, int64_t count, int64_t* out) const;

 private:
  // Extra tokens framing each document: BOS (if configured) and EOS.
  int64_t frame() const { return bos_ ? 2 : 1; }
  // Framed start of local document d inside shard s's stream; monotonic in d.
  int64_t LocalStreamStart(size_t s, int64_t d) const {
    return shards_[s]->doc_begin(d) + d * frame();
  }
  void CopyLocalFramed(size_t s, int64_t d, int64_t offset, int64_t count, int64_t* out) const;

  std::vector<std::unique_ptr<TokenShardReader>> shards_;
  std::vector<int64_t> doc_prefix_{0};     // global index of each shard's first document
  std::vector<int64_t> stream_prefix_{0};  // stream offset of each shard's first framed token
  int64_t num_tokens_ = 0;
  bool bos_;
  int64_t bos_id_;
  int64_t eos_id_;
};

}  // namespace darkformer
