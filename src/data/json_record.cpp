// A strict JSON object parser for C4 records (see json_record.h); grammar per RFC 8259.
#include "data/json_record.h"

#include <cstring>

namespace darkformer {
namespace {

// Deeper nesting than this is refused rather than recursed into: C4 records are flat, and a
// hostile line must not overflow the stack.
constexpr int kMaxDepth = 64;
constexpr char32_t kReplacementCharacter = 0xFFFD;

class RecordParser {
 public:
  explicit RecordParser(std::string_view line) : s_(line) {}

  JsonRecordStatus Parse(std::string* text, std::string* error) {
    SkipSpace();
    if (pos_ == s_.size()) return JsonRecordStatus::kBlank;
    bool found_text = false;
    bool ok = ParseTopObject(text, &found_text);
    if (ok) {
      SkipSpace();
      if (pos_ != s_.size()) ok = Fail("trailing characters after the object");
    }
    if (!ok) {
      if (error) *error = error_ + " at byte " + std::to_string(error_pos_);
      return JsonRecordStatus::kMalformed;
    }
    return found_text ? JsonRecordStatus::kOk : JsonRecordStatus::kNoText;
  }

 private:
  bool Fail(const char* what) {
    if (error_.empty()) {
      error_ = what;
      error_pos_ = pos_;
    }
    return false;
  }

  void SkipSpace() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\r' && c != '\n') break;
      ++pos_;
    }
  }

  bool Expect(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return Fail(c == ':' ? "expected ':'" : c == '"' ? "expected '\"'" : "unexpected character");
  }

  // The top-level object: keys are compared with "text" and only that value is decoded to `text`.
  bool ParseTopObject(std::string* text, bool* found_text) {
    if (!Expect('{')) return false;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    std::string key;
    while (true) {
      SkipSpace();
      key.clear();
      if (!Expect('"') || !ParseStringBody(&key) || !Expect(':')) return false;
      SkipSpace();
      if (key == "text" && pos_ < s_.size() && s_[pos_] == '"') {
        ++pos_;
        text->clear();
        if (!ParseStringBody(text)) return false;
        *found_text = true;
      } else {
        // A non-string "text" counts as no text, like a missing one.
        if (key == "text") *found_text = false;
        if (!SkipValue(1)) return false;
      }
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}' in object");
    }
  }

  // Parses a string body (after the opening quote) through its closing quote. Appends the decoded
  // bytes to `out`, or only validates when `out` is null.
  bool ParseStringBody(std::string* out) {
    while (true) {
      // Fast path: copy the run of plain bytes up to the next quote, backslash or control byte.
      size_t run = pos_;
      while (run < s_.size()) {
        unsigned char c = static_cast<unsigned char>(s_[run]);
        if (c == '"' || c == '\\' || c < 0x20) break;
        ++run;
      }
      if (out) out->append(s_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ == s_.size()) return Fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c != '\\') return Fail("unescaped control character in string");
      if (++pos_ == s_.size()) return Fail("unterminated escape");
      char e = s_[pos_++];
      char decoded = 0;
      switch (e) {
        case '"': decoded = '"'; break;
        case '\\': decoded = '\\'; break;
        case '/': decoded = '/'; break;
        case 'b': decoded = '\b'; break;
        case 'f': decoded = '\f'; break;
        case 'n': decoded = '\n'; break;
        case 'r': decoded = '\r'; break;
        case 't': decoded = '\t'; break;
        case 'u': {
          char32_t cp = 0;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate combines with an immediately following \u low surrogate.
            char32_t low = 0;
            if (pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
              size_t save = pos_;
              pos_ += 2;
              if (!ParseHex4(&low)) return false;
              if (low >= 0xDC00 && low <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
              } else {
                pos_ = save;  // not a pair: the next escape is decoded on its own
                cp = kReplacementCharacter;
              }
            } else {
              cp = kReplacementCharacter;
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            // A lone surrogate is valid JSON but has no UTF-8 form; Python keeps it, we replace it.
            cp = kReplacementCharacter;
          }
          if (out) AppendUtf8(cp, out);
          continue;
        }
        default:
          --pos_;
          return Fail("invalid escape");
      }
      if (out) out->push_back(decoded);
    }
  }

  bool ParseHex4(char32_t* cp) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    char32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_ + i];
      value <<= 4;
      if (h >= '0' && h <= '9') value |= h - '0';
      else if (h >= 'a' && h <= 'f') value |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') value |= h - 'A' + 10;
      else return Fail("invalid hex digit in \\u escape");
    }
    pos_ += 4;
    *cp = value;
    return true;
  }

  bool SkipValue(int depth) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    SkipSpace();
    if (pos_ == s_.size()) return Fail("expected a value");
    char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      return ParseStringBody(nullptr);
    }
    if (c == '{' || c == '[') return SkipContainer(depth);
    if (c == '-' || (c >= '0' && c <= '9')) return SkipNumber();
    for (const char* literal : {"true", "false", "null"}) {
      size_t n = std::strlen(literal);
      if (s_.compare(pos_, n, literal) == 0) {
        pos_ += n;
        return true;
      }
    }
    return Fail("expected a value");
  }

  bool SkipContainer(int depth) {
    char close = s_[pos_] == '{' ? '}' : ']';
    bool is_object = close == '}';
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == close) {
      ++pos_;
      return true;
    }
    while (true) {
      if (is_object) {
        if (!Expect('"') || !ParseStringBody(nullptr) || !Expect(':')) return false;
      }
      if (!SkipValue(depth + 1)) return false;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == close) {
        ++pos_;
        return true;
      }
      return Fail(is_object ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool SkipNumber() {
    auto digit = [&](size_t i) { return i < s_.size() && s_[i] >= '0' && s_[i] <= '9'; };
    if (s_[pos_] == '-') ++pos_;
    if (!digit(pos_)) return Fail("invalid number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (digit(pos_)) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digit(pos_)) return Fail("invalid number");
      while (digit(pos_)) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit(pos_)) return Fail("invalid number");
      while (digit(pos_)) ++pos_;
    }
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
};

}  // namespace

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

JsonRecordStatus ParseC4Record(std::string_view line, std::string* text, std::string* error) {
  return RecordParser(line).Parse(text, error);
}

}  // namespace darkformer
