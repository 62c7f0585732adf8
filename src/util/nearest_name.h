// "Did you mean ...?" for a misspelt config key, kernel or enum value: the closest of the
// declared names by edit distance, if it is close enough to be the likely intent.
#pragma once

#include <string>
#include <vector>

namespace darkformer {

// Levenshtein distance (insertions, deletions, substitutions; a swap of neighbours counts 1).
size_t EditDistance(const std::string& a, const std::string& b);

// The name in `candidates` nearest to `given` (case-insensitive), or "" when none is within
// max(1, min(3, |given| / 3)) edits (so "lrr" -> "lr", but "x" suggests nothing); failing that,
// the one candidate that begins with `given` (at least 3 characters: "bf16" -> "bf16_autocast").
std::string NearestName(const std::string& given, const std::vector<std::string>& candidates);

// "; did you mean 'PREFIX<name>'?" for NearestName, or "".
std::string DidYouMean(const std::string& given, const std::vector<std::string>& candidates,
                       const std::string& prefix = "");

}  // namespace darkformer
