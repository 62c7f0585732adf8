// Token shard writer (see token_shard_writer.h).
#include "data/token_shard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/atomic_file.h"
#include "data/token_shard_format.h"
#include "util/error.h"

namespace darkformer {
namespace {

// The format is little-endian; so is every machine we build for. Fail loudly elsewhere.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards assume a little-endian host");

void WriteOrFail(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  DF_CHECK(std::fwrite(data, 1, bytes, f) == bytes, path << ": write failed: " << std::strerror(errno));
}

void CloseSynced(std::FILE* f, const std::string& path) {
  bool ok = std::fflush(f) == 0;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  DF_CHECK(ok, path << ": flush failed: " << std::strerror(errno));
}

}  // namespace

TokenShardWriter::TokenShardWriter(std::string stem, int bytes_per_token)
    : stem_(std::move(stem)), bytes_per_token_(bytes_per_token) {
  DF_CHECK(bytes_per_token == 2 || bytes_per_token == 4, "bytes per token must be 2 or 4, got " << bytes_per_token);
  std::string tmp = TokensFileName(stem_) + ".tmp";
  tokens_ = std::fopen(tmp.c_str(), "wb");
  DF_CHECK(tokens_ != nullptr, tmp << ": cannot create: " << std::strerror(errno));
  std::setvbuf(tokens_, nullptr, _IOFBF, 1 << 20);
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kTokensMagic, 8);
  uint32_t width = static_cast<uint32_t>(bytes_per_token);
  std::memcpy(header + 8, &width, 4);
  WriteOrFail(tokens_, header, sizeof(header), tmp);
}

TokenShardWriter::~TokenShardWriter() {
  if (tokens_) std::fclose(tokens_);
  if (!finished_) {
    std::remove((TokensFileName(stem_) + ".tmp").c_str());
    std::remove((DocsFileName(stem_) + ".tmp").c_str());
  }
}

void TokenShardWriter::AddDocument(const std::vector<int>& ids) {
  const uint64_t limit = bytes_per_token_ == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  scratch_.resize(ids.size() * bytes_per_token_);
  unsigned char* out = scratch_.data();
  for (int id : ids) {
    DF_CHECK(id >= 0 && static_cast<uint64_t>(id) <= limit,
             TokensFileName(stem_) << ": token id " << id << " does not fit " << bytes_per_token_ << " bytes");
    if (bytes_per_token_ == 2) {
      uint16_t v = static_cast<uint16_t>(id);
      std::memcpy(out, &v, 2);
    } else {
      uint32_t v = static_cast<uint32_t>(id);
      std::memcpy(out, &v, 4);
    }
    out += bytes_per_token_;
  }
  WriteOrFail(tokens_, scratch_.data(), scratch_.size(), TokensFileName(stem_) + ".tmp");
  offsets_.push_back(offsets_.back() + ids.size());
}

void TokenShardWriter::Finish() {
  std::string tokens_tmp = TokensFileName(stem_) + ".tmp";
  std::FILE* f = tokens_;
  tokens_ = nullptr;
  CloseSynced(f, tokens_tmp);

  std::string docs_tmp = DocsFileName(stem_) + ".tmp";
  std::FILE* docs = std::fopen(docs_tmp.c_str(), "wb");
  DF_CHECK(docs != nullptr, docs_tmp << ": cannot create: " << std::strerror(errno));
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kDocsMagic, 8);
  uint64_t count = static_cast<uint64_t>(num_documents());
  std::memcpy(header + 8, &count, 8);
  WriteOrFail(docs, header, sizeof(header), docs_tmp);
  WriteOrFail(docs, offsets_.data(), offsets_.size() * sizeof(uint64_t), docs_tmp);
  CloseSynced(docs, docs_tmp);

  RenameDurably(tokens_tmp, TokensFileName(stem_));
  RenameDurably(docs_tmp, DocsFileName(stem_));
  finished_ = true;
}

}  // namespace darkformer
