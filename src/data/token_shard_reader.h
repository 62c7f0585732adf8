// Reads a token shard (see token_shard_format.h) through read-only memory maps: opening costs no
// copy, and pages load on demand.
#pragma once

#include <cstdint>
#include <string>

namespace darkformer {

// A read-only memory map of one whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  int64_t size_ = 0;
};

class TokenShardReader {
 public:
  // Maps "<stem>.tokens" and "<stem>.docs"; throws naming the file if either is not a consistent
  // shard (bad magic, width, or offsets that do not match the token count).
  explicit TokenShardReader(const std::string& stem);

  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  int bytes_per_token() const { return bytes_per_token_; }
  // Token offsets of document d: [doc_begin(d), doc_begin(d + 1)); d may equal num_documents().
  int64_t doc_begin(int64_t d) const { return static_cast<int64_t>(offsets_[d]); }
  int64_t doc_size(int64_t d) const { return doc_begin(d + 1) - doc_begin(d); }
  // Copies tokens [begin, begin + count) to `out`.
  void CopyTokens(int64_t begin, int64_t count, int64_t* out) const;
  int64_t token(int64_t i) const {
    return bytes_per_token_ == 2 ? tokens16_[i] : static_cast<int64_t>(tokens32_[i]);
  }

 private:
  std::string stem_;
  MappedFile tokens_file_;
  MappedFile docs_file_;
  int bytes_per_token_ = 0;
  int64_t num_tokens_ = 0;
  int64_t num_documents_ = 0;
  const uint16_t* tokens16_ = nullptr;
  const uint32_t* tokens32_ = nullptr;
  const uint64_t* offsets_ = nullptr;
};

}  // namespace darkformer
