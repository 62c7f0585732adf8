// JSON for the application: nlohmann::json, the one JSON library (C4 records, JSONL logs,
// summaries). Non-finite numbers serialise as null, as JSON has no NaN.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace darkformer {

using Json = nlohmann::json;

// One line of JSON (no newline), for JSONL files and stdout results.
inline std::string ToJsonLine(const Json& value) { return value.dump(); }

// `value[key]` as T, or `fallback` when the key is absent or null (a non-finite number).
template <typename T>
T JsonGet(const Json& value, const char* key, const T& fallback) {
  const auto it = value.find(key);
  if (it == value.end() || it->is_null()) return fallback;
  return it->template get<T>();
}

}  // namespace darkformer
