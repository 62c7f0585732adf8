// The declaration of one config key, written where the key is read (absl's ABSL_FLAG, gemma.cpp's
// VisitFields): its doc line, the values it accepts, and whether a resume may change it. With the
// key's name, type and default in the same ConfigReader call, that one statement is the key's
// whole declaration; the reference config, the docs' key table and the resume rules are made
// from the declarations (train/config_reference.h), never written beside them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace darkformer {

// The shortest text that reads back as `value`, always as a float ("0.0003", "1.0e-6", "10000.0").
std::string ShortestNumber(double value);

class KeySpec {
 public:
  KeySpec(const char* doc = "") : doc_(doc) {}  // NOLINT: a doc line converts, as in Get(key, v, "doc")
  explicit KeySpec(std::string doc) : doc_(std::move(doc)) {}

  // Numbers: value >= bound (Min), > bound (Above), <= bound (Max). `note` follows the rule in
  // errors and docs, e.g. Min(0, "0 = off").
  KeySpec& Min(double bound, std::string note = "");
  KeySpec& Above(double bound, std::string note = "");
  KeySpec& Max(double bound);
  // Integers: a multiple of `factor` (`note` says why, e.g. MultipleOf(2, "RoPE")).
  KeySpec& MultipleOf(int64_t factor, std::string note = "");
  // Strings, and each string of a list: one of these spellings. Strings and lists: not empty.
  KeySpec& OneOf(std::vector<std::string> values);
  KeySpec& NonEmpty();
  // A resume may give the key another value (a section: every key in it). docs/training.md.
  KeySpec& Resumable();
  // The value the reference shows for a required key, which has no default.
  KeySpec& Example(std::string yaml);

  const std::string& doc() const { return doc_; }
  bool resumable() const { return resumable_; }
  const std::string& example() const { return example_; }
  // The rule in words for the docs: "> 0", "in [0, 1]", "auto | true | false", "" (any).
  std::string Rule() const;

  // "" when `value` is accepted, else why not: "must be >= 1, got 0".
  template <typename T>
  std::string Refusal(const T& value) const;

 private:
  std::string RefuseNumber(double value, const std::string& text) const;
  std::string RefuseString(const std::string& value) const;
  std::string RefuseMultiple(int64_t value) const;

  std::string doc_;
  std::optional<double> min_, max_;
  bool exclusive_min_ = false;
  std::string note_;
  std::optional<int64_t> multiple_of_;
  std::string multiple_note_;
  std::vector<std::string> one_of_;
  bool non_empty_ = false;
  bool resumable_ = false;
  std::string example_;
};

template <typename T>
std::string KeySpec::Refusal(const T& value) const {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if constexpr (std::is_floating_point_v<T>) {
      return RefuseNumber(value, ShortestNumber(value));
    } else {
      const auto bounds = RefuseNumber(static_cast<double>(value), std::to_string(value));
      return bounds.empty() ? RefuseMultiple(static_cast<int64_t>(value)) : bounds;
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    return RefuseString(value);
  } else if constexpr (std::is_same_v<T, bool>) {
    return "";
  } else {
    if (non_empty_ && value.empty()) return "must not be empty";
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      for (size_t i = 0; i < value.size(); ++i) {
        if (auto refusal = RefuseString(value[i]); !refusal.empty()) return "[" + std::to_string(i) + "] " + refusal;
      }
    }
    return "";
  }
}

}  // namespace darkformer
