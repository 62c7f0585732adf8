// A one-line JSON object builder for JSONL logs (metrics, spikes, summaries): numbers, strings,
// booleans, nested objects and lists of objects or integers; non-finite numbers become null, as JSON has no NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

namespace darkformer {

class JsonLine {
 public:
  JsonLine& Add(const std::string& key, double value) {
    Key(key);
    if (std::isfinite(value)) {
      out_ << std::setprecision(10) << value;
    } else {
      out_ << "null";
    }
    return *this;
  }
  JsonLine& Add(const std::string& key, int64_t value) {
    Key(key);
    out_ << value;
    return *this;
  }
  JsonLine& Add(const std::string& key, int value) { return Add(key, static_cast<int64_t>(value)); }
  JsonLine& Add(const std::string& key, bool value) {
    Key(key);
    out_ << (value ? "true" : "false");
    return *this;
  }
  JsonLine& Add(const std::string& key, const std::string& value) {
    Key(key);
    out_ << Quote(value);
    return *this;
  }
  JsonLine& Add(const std::string& key, const char* value) { return Add(key, std::string(value)); }
  JsonLine& AddObject(const std::string& key, const JsonLine& object) {
    Key(key);
    out_ << object.str();
    return *this;
  }
  // `objects` are JsonLine::str() results.
  JsonLine& AddObjects(const std::string& key, const std::vector<std::string>& objects) {
    Key(key);
    out_ << "[";
    for (size_t i = 0; i < objects.size(); ++i) out_ << (i ? "," : "") << objects[i];
    out_ << "]";
    return *this;
  }
  JsonLine& AddInts(const std::string& key, const std::vector<int64_t>& values) {
    Key(key);
    out_ << "[";
    for (size_t i = 0; i < values.size(); ++i) out_ << (i ? "," : "") << values[i];
    out_ << "]";
    return *this;
  }
  std::string str() const { return "{" + out_.str() + "}"; }

  static std::string Quote(const std::string& s) {
    std::ostringstream q;
    q << '"';
    for (const char c : s) {
      switch (c) {
        case '"': q << "\\\""; break;
        case '\\': q << "\\\\"; break;
        case '\n': q << "\\n"; break;
        case '\t': q << "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            q << "\\u" << std::hex << std::setw(4) << std::setfill('0') << static_cast<int>(c) << std::dec;
          } else {
            q << c;
          }
      }
    }
    q << '"';
    return q.str();
  }

 private:
  void Key(const std::string& key) {
    if (!first_) out_ << ",";
    first_ = false;
    out_ << Quote(key) << ":";
  }
  std::ostringstream out_;
  bool first_ = true;
};

}  // namespace darkformer
