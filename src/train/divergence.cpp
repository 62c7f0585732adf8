// Declaring divergence from the step verdicts (see divergence.h).
#include "train/divergence.h"

#include <algorithm>
#include <sstream>

#include "util/error.h"

namespace darkformer {

std::optional<Divergence> DivergenceDetector::Observe(int64_t step, bool spike, bool skipped, bool finite) {
  if (spike) spikes_.push_back(step);
  while (!spikes_.empty() && spikes_.front() <= step - rules_.window) spikes_.pop_front();
  if (skipped) {
    if (skips_in_row_ == 0) first_skip_ = step;
    ++skips_in_row_;
  } else {
    skips_in_row_ = 0;
  }
  std::optional<Divergence> found;
  const int64_t first_spike = spikes_.empty() ? step : spikes_.front();
  if (rules_.nonfinite && !finite) {
    found = Divergence{step, first_spike, "a non-finite loss or grad norm"};
  } else if (static_cast<int64_t>(spikes_.size()) >= rules_.spikes) {
    found = Divergence{step, first_spike,
                       std::to_string(spikes_.size()) + " flagged steps within " + std::to_string(rules_.window)};
  } else if (rules_.consecutive_skips > 0 && skips_in_row_ >= rules_.consecutive_skips) {
    found = Divergence{step, std::min(first_skip_, first_spike),
                       std::to_string(skips_in_row_) + " skipped updates in a row"};
  }
  if (found) {
    spikes_.clear();
    skips_in_row_ = 0;
    first_skip_ = 0;
  }
  return found;
}

std::string DivergenceDetector::Serialize() const {
  std::string text;
  for (const auto step : spikes_) text += (text.empty() ? "" : ",") + std::to_string(step);
  return text + ";" + std::to_string(first_skip_) + "," + std::to_string(skips_in_row_);
}

void DivergenceDetector::Restore(const std::string& text) {
  spikes_.clear();
  first_skip_ = skips_in_row_ = 0;
  if (text.empty()) return;
  const auto semicolon = text.find(';');
  DF_CHECK(semicolon != std::string::npos, "divergence state '" << text << "' is not 'spikes;first_skip,count'");
  std::stringstream spikes(text.substr(0, semicolon));
  std::string item;
  try {
    while (std::getline(spikes, item, ',')) spikes_.push_back(std::stoll(item));
    const auto skips = text.substr(semicolon + 1);
    const auto comma = skips.find(',');
    first_skip_ = std::stoll(skips.substr(0, comma));
    skips_in_row_ = std::stoll(skips.substr(comma + 1));
  } catch (const std::exception&) {
    Fail("divergence state '" + text + "' is not 'spikes;first_skip,count'");
  }
}

}  // namespace darkformer
