// Line-streaming C4 reader over zlib's gz* API (see c4_reader.h).
#include "data/c4_reader.h"

#include <cerrno>
#include <cstring>

#include "data/json_record.h"
#include "util/error.h"

namespace darkformer {
namespace {

constexpr size_t kMaxRememberedErrors = 5;

}  // namespace

C4ReadCounts& C4ReadCounts::operator+=(const C4ReadCounts& other) {
  lines += other.lines;
  documents += other.documents;
  blank += other.blank;
  malformed += other.malformed;
  no_text += other.no_text;
  text_bytes += other.text_bytes;
  return *this;
}

bool NextNonBlankLine(LineReader& lines, std::string_view* line, C4ReadCounts* counts) {
  while (lines.Next(line)) {
    counts->lines = lines.lines();
    if (!IsBlankLine(*line)) return true;
    ++counts->blank;
  }
  return false;
}

C4Reader::C4Reader(std::string path) : lines_(std::move(path)) {}

bool C4Reader::Next(std::string* text) {
  std::string_view line;
  std::string error;
  while (lines_.Next(&line)) {
    counts_.lines = lines_.lines();
    std::string* error_out = first_errors_.size() < kMaxRememberedErrors ? &error : nullptr;
    switch (ParseC4Record(line, text, error_out)) {
      case JsonRecordStatus::kOk:
        ++counts_.documents;
        counts_.text_bytes += static_cast<int64_t>(text->size());
        return true;
      case JsonRecordStatus::kBlank:
        ++counts_.blank;
        break;
      case JsonRecordStatus::kMalformed:
        ++counts_.malformed;
        if (error_out) first_errors_.push_back(path() + ":" + std::to_string(counts_.lines) + ": " + error);
        break;
      case JsonRecordStatus::kNoText:
        ++counts_.no_text;
        if (error_out) {
          first_errors_.push_back(path() + ":" + std::to_string(counts_.lines) + ": no string \"text\" field");
        }
        break;
    }
  }
  return false;
}

}  // namespace darkformer
