// The labels file of a labelled shard ("<stem>.labels", see token_shard_format.h): one int32 per
// token, beside the token file and document index, which it shares. Written under a temporary
// name and renamed into place in Finish(), as the token files are; read through a memory map.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/token_shard_reader.h"

namespace darkformer {

class LabelShardWriter {
 public:
  explicit LabelShardWriter(std::string stem);
  // Removes the temporary file unless Finish() succeeded.
  ~LabelShardWriter();
  LabelShardWriter(const LabelShardWriter&) = delete;
  LabelShardWriter& operator=(const LabelShardWriter&) = delete;

  // Appends one record's labels (as many as its tokens).
  void AddDocument(const std::vector<int>& labels);
  void Finish();
  int64_t num_labels() const { return count_; }

 private:
  std::string stem_;
  std::FILE* file_ = nullptr;
  int64_t count_ = 0;
  bool finished_ = false;
};

class LabelShardReader {
 public:
  // Maps "<stem>.labels"; throws naming the file unless it is a labels file of `expected` labels.
  LabelShardReader(const std::string& stem, int64_t expected);
  // Copies labels [begin, begin + count) to `out`.
  void CopyLabels(int64_t begin, int64_t count, int64_t* out) const;

 private:
  MappedFile file_;
  const int32_t* labels_ = nullptr;
};

}  // namespace darkformer
