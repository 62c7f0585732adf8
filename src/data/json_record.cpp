// C4 records through nlohmann::json's SAX interface (see json_record.h): no document tree is
// built; only the top-level "text" string is kept.
#include "data/json_record.h"

#include <nlohmann/json.hpp>

namespace darkformer {
namespace {

// Deeper nesting than this is refused: C4 records are flat, and a hostile line must not make
// the parser's stack grow without bound.
constexpr int kMaxDepth = 64;

class TextExtractor : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit TextExtractor(std::string* text) : text_(text) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool string(string_t& value) override {
    if (!top_level_text_key_ || depth_ != 1) return Value();
    *text_ = std::move(value);
    found_text_ = true;
    top_level_text_key_ = false;
    return true;
  }
  bool key(string_t& name) override {
    top_level_text_key_ = depth_ == 1 && name == "text";
    return true;
  }
  bool start_object(std::size_t) override { return Open(); }
  bool start_array(std::size_t) override {
    if (depth_ == 0) return Refuse("a JSON array, not an object", 0);
    return Open();
  }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    if (error_.empty()) {
      error_ = e.what();
      position_ = position;
    }
    return false;
  }

  bool found_text() const { return found_text_; }
  bool saw_object() const { return saw_object_; }
  std::string error() const { return error_ + " at byte " + std::to_string(position_); }

 private:
  bool Value() {
    // A non-string "text" at the top level counts as no text, like a missing one; a later string
    // "text" still wins (Python's json keeps the last duplicate key).
    if (depth_ == 0) return Refuse("a JSON scalar, not an object", 0);
    if (top_level_text_key_ && depth_ == 1) found_text_ = false;
    top_level_text_key_ = false;
    return true;
  }
  bool Open() {
    if (depth_ == 0) saw_object_ = true;
    if (top_level_text_key_ && depth_ == 1) found_text_ = false;
    top_level_text_key_ = false;
    return ++depth_ <= kMaxDepth || Refuse("nesting deeper than 64 levels", 0);
  }
  bool Close() {
    --depth_;
    return true;
  }
  bool Refuse(const char* what, std::size_t position) {
    error_ = what;
    position_ = position;
    return false;
  }

  std::string* text_;
  int depth_ = 0;
  bool top_level_text_key_ = false;
  bool found_text_ = false;
  bool saw_object_ = false;
  std::string error_;
  std::size_t position_ = 0;
};

}  // namespace

bool IsBlankLine(std::string_view line) { return line.find_first_not_of(" \t\r\n") == std::string_view::npos; }

JsonRecordStatus ParseC4Record(std::string_view line, std::string* text, std::string* error) {
  if (IsBlankLine(line)) return JsonRecordStatus::kBlank;
  TextExtractor extractor(text);
  const bool ok = nlohmann::json::sax_parse(line.begin(), line.end(), &extractor,
                                            nlohmann::json::input_format_t::json, /*strict=*/true);
  if (!ok || !extractor.saw_object()) {
    if (error) *error = ok ? std::string("not a JSON object at byte 0") : extractor.error();
    return JsonRecordStatus::kMalformed;
  }
  return extractor.found_text() ? JsonRecordStatus::kOk : JsonRecordStatus::kNoText;
}

}  // namespace darkformer
