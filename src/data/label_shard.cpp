// Labels file of a labelled shard (see label_shard.h).
#include "data/label_shard.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "data/token_shard_format.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace darkformer {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "label shards assume a little-endian host");

LabelShardWriter::LabelShardWriter(std::string stem) : stem_(std::move(stem)) {
  const std::string tmp = LabelsFileName(stem_) + ".tmp";
  file_ = std::fopen(tmp.c_str(), "wb");
  DF_CHECK(file_ != nullptr, tmp << ": cannot create: " << std::strerror(errno));
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kLabelsMagic, 8);
  const uint32_t width = 4;
  std::memcpy(header + 8, &width, 4);
  DF_CHECK(std::fwrite(header, 1, sizeof(header), file_) == sizeof(header), tmp << ": write failed");
}

LabelShardWriter::~LabelShardWriter() {
  if (file_) std::fclose(file_);
  if (!finished_) std::remove((LabelsFileName(stem_) + ".tmp").c_str());
}

void LabelShardWriter::AddDocument(const std::vector<int>& labels) {
  std::vector<int32_t> values(labels.begin(), labels.end());
  const size_t bytes = values.size() * sizeof(int32_t);
  DF_CHECK(std::fwrite(values.data(), 1, bytes, file_) == bytes,
           LabelsFileName(stem_) << ".tmp: write failed: " << std::strerror(errno));
  count_ += static_cast<int64_t>(values.size());
}

void LabelShardWriter::Finish() {
  const std::string tmp = LabelsFileName(stem_) + ".tmp";
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  DF_CHECK(ok, tmp << ": flush failed: " << std::strerror(errno));
  RenameDurably(tmp, LabelsFileName(stem_));
  finished_ = true;
}

LabelShardReader::LabelShardReader(const std::string& stem, int64_t expected) : file_(LabelsFileName(stem)) {
  const std::string path = LabelsFileName(stem);
  DF_CHECK(file_.size() >= kShardHeaderBytes && std::memcmp(file_.data(), kLabelsMagic, 8) == 0,
           path << ": not a darkformer labels file (bad header)");
  DF_CHECK(file_.size() == kShardHeaderBytes + expected * 4,
           path << ": holds " << (file_.size() - kShardHeaderBytes) / 4 << " labels, but its token file holds "
                << expected << " tokens (truncated?)");
  labels_ = reinterpret_cast<const int32_t*>(file_.data() + kShardHeaderBytes);
}

void LabelShardReader::CopyLabels(int64_t begin, int64_t count, int64_t* out) const {
  for (int64_t i = 0; i < count; ++i) out[i] = labels_[begin + i];
}

}  // namespace darkformer
