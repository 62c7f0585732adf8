// Key declarations' rules and their refusals (see key_spec.h).
#include "util/key_spec.h"

#include <charconv>
#include <cmath>

namespace darkformer {

std::string ShortestNumber(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), value).ptr;
  std::string text(buffer, end);
  // YAML 1.1 readers (PyYAML) take a float only with a dot and a signed exponent: 1e-06 -> 1.0e-6.
  const auto e = text.find('e');
  std::string mantissa = text.substr(0, e), exponent = e == std::string::npos ? "" : text.substr(e + 1);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (exponent.empty()) return mantissa;
  const char sign = exponent[0] == '-' || exponent[0] == '+' ? exponent[0] : '+';
  std::string digits = exponent.substr(exponent[0] == '-' || exponent[0] == '+' ? 1 : 0);
  while (digits.size() > 1 && digits[0] == '0') digits.erase(0, 1);
  return mantissa + "e" + sign + digits;
}

KeySpec& KeySpec::Min(double bound, std::string note) {
  min_ = bound;
  exclusive_min_ = false;
  note_ = std::move(note);
  return *this;
}

KeySpec& KeySpec::Above(double bound, std::string note) {
  min_ = bound;
  exclusive_min_ = true;
  note_ = std::move(note);
  return *this;
}

KeySpec& KeySpec::Max(double bound) {
  max_ = bound;
  return *this;
}

KeySpec& KeySpec::MultipleOf(int64_t factor, std::string note) {
  multiple_of_ = factor;
  multiple_note_ = std::move(note);
  return *this;
}

KeySpec& KeySpec::OneOf(std::vector<std::string> values) {
  one_of_ = std::move(values);
  return *this;
}

KeySpec& KeySpec::NonEmpty() {
  non_empty_ = true;
  return *this;
}

KeySpec& KeySpec::Resumable() {
  resumable_ = true;
  return *this;
}

KeySpec& KeySpec::Example(std::string yaml) {
  example_ = std::move(yaml);
  return *this;
}

namespace {

// Bounds print as integers when they are ("0", not "0.0").
std::string Bound(double value) {
  return value == std::floor(value) && std::fabs(value) < 1e15 ? std::to_string(static_cast<int64_t>(value))
                                                               : ShortestNumber(value);
}

}  // namespace

std::string KeySpec::Rule() const {
  std::string rule;
  if (min_ && max_) {
    rule = std::string("in ") + (exclusive_min_ ? "(" : "[") + Bound(*min_) + ", " + Bound(*max_) + "]";
  } else if (min_) {
    rule = exclusive_min_ && *min_ == 0 ? "positive" : (exclusive_min_ ? "> " : ">= ") + Bound(*min_);
  } else if (max_) {
    rule = "<= " + Bound(*max_);
  }
  if (multiple_of_) {
    rule += (rule.empty() ? "a multiple of " : ", a multiple of ") + std::to_string(*multiple_of_);
    if (!multiple_note_.empty()) rule += " (" + multiple_note_ + ")";
  }
  for (const auto& value : one_of_) rule += (rule.empty() ? "" : " | ") + value;
  if (non_empty_) rule += rule.empty() ? "not empty" : ", not empty";
  if (!note_.empty()) rule += " (" + note_ + ")";
  return rule;
}

std::string KeySpec::RefuseNumber(double value, const std::string& text) const {
  const bool below = min_ && (exclusive_min_ ? !(value > *min_) : !(value >= *min_));
  const bool above = max_ && !(value <= *max_);
  if (!below && !above) return "";
  return "must be " + Rule() + ", got " + text;
}

std::string KeySpec::RefuseMultiple(int64_t value) const {
  if (!multiple_of_ || value % *multiple_of_ == 0) return "";
  return "must be " + Rule() + ", got " + std::to_string(value);
}

std::string KeySpec::RefuseString(const std::string& value) const {
  if (non_empty_ && value.find_first_not_of(" \t\r\n") == std::string::npos) return "must not be empty";
  if (one_of_.empty()) return "";
  for (const auto& allowed : one_of_) {
    if (allowed == value) return "";
  }
  std::string valid;
  for (const auto& allowed : one_of_) valid += (valid.empty() ? "" : ", ") + allowed;
  return "must be one of " + valid + "; got '" + value + "'";
}

}  // namespace darkformer
