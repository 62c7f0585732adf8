// Memory-mapped token shard reader (see token_shard_reader.h).
#include "data/token_shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "data/token_shard_format.h"
#include "util/error.h"

namespace darkformer {

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  DF_CHECK(fd >= 0, path << ": cannot open: " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int saved = errno;
    ::close(fd);
    Fail(path + ": cannot stat: " + std::strerror(saved));
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    int saved = errno;
    ::close(fd);
    DF_CHECK(p != MAP_FAILED, path << ": mmap failed: " << std::strerror(saved));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
}

TokenShardReader::TokenShardReader(const std::string& stem)
    : stem_(stem), tokens_file_(TokensFileName(stem)), docs_file_(DocsFileName(stem)) {
  const std::string tokens_path = TokensFileName(stem);
  const std::string docs_path = DocsFileName(stem);
  DF_CHECK(tokens_file_.size() >= kShardHeaderBytes && std::memcmp(tokens_file_.data(), kTokensMagic, 8) == 0,
           tokens_path << ": not a darkformer token file (bad header)");
  uint32_t width = 0;
  std::memcpy(&width, tokens_file_.data() + 8, 4);
  DF_CHECK(width == 2 || width == 4, tokens_path << ": bytes per token is " << width << ", expected 2 or 4");
  bytes_per_token_ = static_cast<int>(width);
  int64_t payload = tokens_file_.size() - kShardHeaderBytes;
  DF_CHECK(payload % width == 0, tokens_path << ": size is not a whole number of tokens (truncated?)");
  num_tokens_ = payload / width;
  const void* tokens = tokens_file_.data() + kShardHeaderBytes;
  if (width == 2) tokens16_ = static_cast<const uint16_t*>(tokens);
  else tokens32_ = static_cast<const uint32_t*>(tokens);

  DF_CHECK(docs_file_.size() >= kShardHeaderBytes && std::memcmp(docs_file_.data(), kDocsMagic, 8) == 0,
           docs_path << ": not a darkformer document index (bad header)");
  uint64_t count = 0;
  std::memcpy(&count, docs_file_.data() + 8, 8);
  DF_CHECK(static_cast<int64_t>((count + 1) * sizeof(uint64_t)) == docs_file_.size() - kShardHeaderBytes,
           docs_path << ": holds " << count << " documents but its size does not match (truncated?)");
  num_documents_ = static_cast<int64_t>(count);
  offsets_ = reinterpret_cast<const uint64_t*>(docs_file_.data() + kShardHeaderBytes);
  DF_CHECK(offsets_[0] == 0 && static_cast<int64_t>(offsets_[count]) == num_tokens_,
           docs_path << ": document offsets end at " << offsets_[count] << " but " << tokens_path << " holds "
                     << num_tokens_ << " tokens");
}

void TokenShardReader::CopyTokens(int64_t begin, int64_t count, int64_t* out) const {
  if (bytes_per_token_ == 2) {
    const uint16_t* p = tokens16_ + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  } else {
    const uint32_t* p = tokens32_ + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  }
}

}  // namespace darkformer
