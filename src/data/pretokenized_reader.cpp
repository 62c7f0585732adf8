// Pre-tokenized documents from JSON lines or .npy (see pretokenized_reader.h).
#include "data/pretokenized_reader.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "util/error.h"
#include "util/json.h"

namespace darkformer {

namespace {

constexpr size_t kMaxRememberedErrors = 5;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
void AppendAs(const char* bytes, int64_t count, std::vector<int64_t>* out) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, bytes + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out->push_back(static_cast<int64_t>(value));
  }
}

}  // namespace

std::vector<int64_t> ReadNpyIntegers(const std::string& path, int64_t* rows, int64_t* cols) {
  std::ifstream in(path, std::ios::binary);
  DF_CHECK(in, path << ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // NPY format: "\x93NUMPY", version (2 bytes), header length (2 bytes in v1, 4 in v2/v3), header.
  DF_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, "\x93NUMPY") == 0, path << ": not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : 4;
  uint32_t header_length = 0;
  std::memcpy(&header_length, bytes.data() + 8, length_bytes);
  const size_t data_start = 8 + length_bytes + header_length;
  DF_CHECK(bytes.size() >= data_start, path << ": truncated .npy header");
  const std::string header = bytes.substr(8 + length_bytes, header_length);
  std::smatch m;
  DF_CHECK(std::regex_search(header, m, std::regex(R"('descr':\s*'([<|=])([iu])([1248])')")),
           path << ": .npy dtype must be a little-endian integer, header " << header);
  DF_CHECK(header.find("'fortran_order': False") != std::string::npos, path << ": .npy must be in C order");
  const bool is_signed = m[2] == "i";
  const int width = std::stoi(m[3]);
  std::smatch s;
  DF_CHECK(std::regex_search(header, s, std::regex(R"('shape':\s*\((\d+),\s*(\d*)\))")),
           path << ": .npy must be 1-D or 2-D, header " << header);
  *rows = s[2].length() ? std::stoll(s[1]) : 1;
  *cols = s[2].length() ? std::stoll(s[2]) : std::stoll(s[1]);
  const int64_t count = *rows * *cols;
  DF_CHECK(static_cast<int64_t>(bytes.size() - data_start) >= count * width,
           path << ": truncated .npy data (" << count << " ids of " << width << " bytes expected)");
  std::vector<int64_t> out;
  out.reserve(count);
  const char* data = bytes.data() + data_start;
  switch (width * (is_signed ? 1 : -1)) {
    case 1: AppendAs<int8_t>(data, count, &out); break;
    case 2: AppendAs<int16_t>(data, count, &out); break;
    case 4: AppendAs<int32_t>(data, count, &out); break;
    case 8: AppendAs<int64_t>(data, count, &out); break;
    case -1: AppendAs<uint8_t>(data, count, &out); break;
    case -2: AppendAs<uint16_t>(data, count, &out); break;
    case -4: AppendAs<uint32_t>(data, count, &out); break;
    default: AppendAs<uint64_t>(data, count, &out); break;
  }
  return out;
}

PretokenizedReader::PretokenizedReader(std::string path, int64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size) {
  if (EndsWith(path_, ".npy")) {
    npy_ = ReadNpyIntegers(path_, &npy_rows_, &npy_cols_);
  } else {
    lines_ = std::make_unique<LineReader>(path_);
  }
}

PretokenizedReader::~PretokenizedReader() = default;

bool PretokenizedReader::Next(std::vector<int>* ids) { return lines_ ? NextJsonLine(ids) : NextNpyRow(ids); }

void PretokenizedReader::CheckIds(const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    DF_CHECK(id >= 0 && id < vocab_size_, path_ << ":" << counts_.lines << ": token id " << id
                                                << " outside the vocabulary [0, " << vocab_size_ << ") (--vocab-size)");
  }
}

bool PretokenizedReader::NextNpyRow(std::vector<int>* ids) {
  if (npy_next_ >= npy_rows_) return false;
  const std::vector<int64_t> row(npy_.begin() + npy_next_ * npy_cols_, npy_.begin() + (npy_next_ + 1) * npy_cols_);
  ++npy_next_;
  ++counts_.lines;
  CheckIds(row);
  ids->assign(row.begin(), row.end());
  ++counts_.documents;
  counts_.text_bytes += static_cast<int64_t>(row.size() * sizeof(int32_t));
  return true;
}

bool PretokenizedReader::NextJsonLine(std::vector<int>* ids) {
  std::string_view line;
  while (NextNonBlankLine(*lines_, &line, &counts_)) {
    const auto json = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    const Json* array = json.is_array() ? &json : nullptr;
    if (json.is_object() && json.contains("input_ids")) array = &json["input_ids"];
    std::vector<int64_t> values;
    bool ok = array && array->is_array();
    for (size_t i = 0; ok && i < array->size(); ++i) {
      ok = (*array)[i].is_number_integer();
      if (ok) values.push_back((*array)[i].get<int64_t>());
    }
    if (!ok) {
      ++(json.is_discarded() ? counts_.malformed : counts_.no_text);
      if (first_errors_.size() < kMaxRememberedErrors) {
        first_errors_.push_back(path_ + ":" + std::to_string(counts_.lines) +
                                ": not a JSON array of integer ids (or an object with one as \"input_ids\")");
      }
      continue;
    }
    CheckIds(values);
    ids->assign(values.begin(), values.end());
    ++counts_.documents;
    counts_.text_bytes += static_cast<int64_t>(values.size() * sizeof(int32_t));
    return true;
  }
  return false;
}

}  // namespace darkformer
