// Nearest declared name by edit distance (see nearest_name.h).
#include "util/nearest_name.h"

#include <algorithm>
#include <cctype>

namespace darkformer {

namespace {

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

size_t EditDistance(const std::string& a, const std::string& b) {
  // Optimal string alignment: Levenshtein plus transpositions of adjacent characters.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string NearestName(const std::string& given, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, given.size() / 3));
  const std::string lowered = Lower(given);
  std::string best;
  size_t best_distance = limit + 1;
  for (const auto& name : candidates) {
    if (name == given) continue;
    const size_t distance = EditDistance(lowered, Lower(name));
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  if (!best.empty() || lowered.size() < 3) return best;
  // No near spelling: a name the given one begins ("bf16" -> "bf16_autocast"), if only one does.
  for (const auto& name : candidates) {
    if (Lower(name).rfind(lowered, 0) != 0) continue;
    if (!best.empty()) return "";
    best = name;
  }
  return best;
}

std::string DidYouMean(const std::string& given, const std::vector<std::string>& candidates, const std::string& prefix) {
  const auto nearest = NearestName(given, candidates);
  return nearest.empty() ? "" : "; did you mean '" + prefix + nearest + "'?";
}

}  // namespace darkformer
