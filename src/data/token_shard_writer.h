// Writes one token shard (token file + document index, see token_shard_format.h) under temporary
// names and renames them into place only in Finish(), so a killed writer leaves no complete-looking
// shard behind.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace darkformer {

class TokenShardWriter {
 public:
  // `stem` is the path without extension ("<dir>/shard-00003.train"); `bytes_per_token` 2 or 4.
  TokenShardWriter(std::string stem, int bytes_per_token);
  // Removes the temporary files unless Finish() succeeded.
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends one document's ids; throws if an id does not fit the token width.
  void AddDocument(const std::vector<int>& ids);
  // Flushes and syncs both files, then renames them to their final names.
  void Finish();

  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(offsets_.back()); }
  const std::string& stem() const { return stem_; }

 private:
  std::string stem_;
  int bytes_per_token_;
  std::FILE* tokens_ = nullptr;
  std::vector<uint64_t> offsets_{0};
  std::vector<unsigned char> scratch_;
  bool finished_ = false;
};

}  // namespace darkformer
