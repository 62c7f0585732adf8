// Labelled records from JSON lines or paired .npy files (see labelled_record_reader.h).
#include "data/labelled_record_reader.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "data/pretokenized_reader.h"
#include "util/error.h"
#include "util/json.h"
#include "util/labels.h"

namespace darkformer {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Values beyond int32 fail the vocabulary check anyway; clamping keeps them failing it, by name.
int ClampToInt(int64_t x) { return static_cast<int>(std::max<int64_t>(std::min<int64_t>(x, INT32_MAX), INT32_MIN)); }

// `json[key]` as integers, or a failure naming `where` and what is wrong.
std::vector<int> IntegerArray(const Json& json, const char* key, const std::string& where) {
  const auto it = json.find(key);
  DF_CHECK(it != json.end(), where << ": missing field \"" << key << "\"");
  DF_CHECK(it->is_array(), where << ": field \"" << key << "\" is not an array of integers");
  std::vector<int> values;
  values.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& v = (*it)[i];
    DF_CHECK(v.is_number_integer(), where << ": " << key << "[" << i << "] = " << v.dump() << " is not an integer");
    values.push_back(ClampToInt(v.get<int64_t>()));
  }
  return values;
}

}  // namespace

std::string PairedLabelsNpyPath(const std::string& input_ids_path) {
  const std::filesystem::path path(input_ids_path);
  std::string name = path.filename().string();
  const auto at = name.rfind("input_ids");
  DF_CHECK(at != std::string::npos,
           input_ids_path << ": a labelled .npy input must have \"input_ids\" in its name, its labels in the file "
                             "named with \"labels\" instead (x.input_ids.npy + x.labels.npy); give only the "
                             "input_ids file to --input / --val-input");
  name.replace(at, 9, "labels");
  return (path.parent_path() / name).string();
}

LabelledRecordReader::LabelledRecordReader(std::string path, int64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size) {
  if (!EndsWith(path_, ".npy")) {
    lines_ = std::make_unique<LineReader>(path_);
    return;
  }
  labels_path_ = PairedLabelsNpyPath(path_);
  DF_CHECK(std::filesystem::exists(labels_path_), path_ << ": its labels file " << labels_path_ << " does not exist");
  npy_ids_ = ReadNpyIntegers(path_, &npy_rows_, &npy_cols_);
  int64_t rows = 0, cols = 0;
  npy_labels_ = ReadNpyIntegers(labels_path_, &rows, &cols);
  DF_CHECK(rows == npy_rows_ && cols == npy_cols_, labels_path_ << ": shape [" << rows << ", " << cols << "] but "
                                                                << path_ << " has [" << npy_rows_ << ", "
                                                                << npy_cols_ << "]");
}

LabelledRecordReader::~LabelledRecordReader() = default;

bool LabelledRecordReader::Next(LabelledRecord* record) { return lines_ ? NextJsonLine(record) : NextNpyRow(record); }

void LabelledRecordReader::Check(const LabelledRecord& r, const std::string& where) const {
  DF_CHECK(r.input_ids.size() == r.labels.size(),
           where << ": " << r.input_ids.size() << " input_ids but " << r.labels.size() << " labels");
  for (size_t i = 0; i < r.input_ids.size(); ++i) {
    DF_CHECK(r.input_ids[i] >= 0 && r.input_ids[i] < vocab_size_,
             where << ": input_ids[" << i << "] = " << r.input_ids[i] << " is outside the vocabulary [0, "
                   << vocab_size_ << ") (--vocab-size)");
    DF_CHECK(r.labels[i] == kIgnoreIndex || (r.labels[i] >= 0 && r.labels[i] < vocab_size_),
             where << ": labels[" << i << "] = " << r.labels[i] << " is neither -100 nor in the vocabulary [0, "
                   << vocab_size_ << ") (--vocab-size)");
  }
}

bool LabelledRecordReader::NextNpyRow(LabelledRecord* record) {
  if (npy_next_ >= npy_rows_) return false;
  const int64_t begin = npy_next_ * npy_cols_, end = begin + npy_cols_;
  ++npy_next_;
  counts_.lines = npy_next_;
  const std::string where = path_ + ":" + std::to_string(npy_next_);
  record->input_ids.clear();
  record->labels.clear();
  for (int64_t i = begin; i < end; ++i) {
    record->input_ids.push_back(ClampToInt(npy_ids_[i]));
    record->labels.push_back(ClampToInt(npy_labels_[i]));
  }
  Check(*record, where);
  ++counts_.documents;
  counts_.text_bytes += static_cast<int64_t>(record->input_ids.size() * sizeof(int32_t));
  return true;
}

bool LabelledRecordReader::NextJsonLine(LabelledRecord* record) {
  std::string_view line;
  while (NextNonBlankLine(*lines_, &line, &counts_)) {
    const std::string where = path_ + ":" + std::to_string(counts_.lines);
    const auto json = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    DF_CHECK(json.is_object(), where << ": not a JSON object {\"input_ids\": [...], \"labels\": [...]}");
    record->input_ids = IntegerArray(json, "input_ids", where);
    record->labels = IntegerArray(json, "labels", where);
    Check(*record, where);
    ++counts_.documents;
    counts_.text_bytes += static_cast<int64_t>(record->input_ids.size() * sizeof(int32_t));
    return true;
  }
  return false;
}

}  // namespace darkformer
