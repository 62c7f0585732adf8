// One JSON-lines record of C4: a JSON object from which we keep the string field "text" (every
// JSON escape decoded to UTF-8). Parsed with nlohmann::json's SAX interface.
#pragma once

#include <string>
#include <string_view>

namespace darkformer {

// Whether `line` holds nothing but whitespace: a JSON-lines file's blank line, not a record.
bool IsBlankLine(std::string_view line);

enum class JsonRecordStatus {
  kOk,         // a well-formed object with a string "text" field
  kBlank,      // an empty or all-whitespace line
  kMalformed,  // not a single well-formed JSON object (RFC 8259; lone UTF-16 surrogates included)
  kNoText,     // a well-formed object without a string "text" field
};

// Parses `line` (one line, without its '\n') as a JSON object. On kOk, `text` holds the decoded
// "text" value (the last one when the key repeats, as Python's json does). Other values are
// validated and skipped, so a record with numbers or nested objects still parses. On kMalformed,
// `error` (when not null) says what and at which byte offset.
JsonRecordStatus ParseC4Record(std::string_view line, std::string* text, std::string* error = nullptr);

}  // namespace darkformer
