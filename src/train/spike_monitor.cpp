// Loss-spike detection (see spike_monitor.h).
#include "train/spike_monitor.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace darkformer {

namespace {
struct Stats {
  double mean = 0, std = 0;
};
template <typename Get>
Stats WindowStats(const std::deque<std::pair<double, double>>& w, Get get) {
  Stats s;
  for (const auto& e : w) s.mean += get(e);
  s.mean /= static_cast<double>(w.size());
  for (const auto& e : w) s.std += (get(e) - s.mean) * (get(e) - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(w.size() > 1 ? w.size() - 1 : 1));
  return s;
}
}  // namespace

SpikeVerdict SpikeMonitor::Observe(double loss, double grad_norm) {
  SpikeVerdict v;
  if (static_cast<int64_t>(window_.size()) >= config_.min_history) {
    const auto ls = WindowStats(window_, [](const auto& e) { return e.first; });
    const auto gs = WindowStats(window_, [](const auto& e) { return e.second; });
    double min_loss = window_.front().first;
    for (const auto& e : window_) min_loss = std::min(min_loss, e.first);
    v.loss_mean = ls.mean;
    v.loss_std = ls.std;
    v.grad_norm_mean = gs.mean;
    v.grad_norm_std = gs.std;
    v.loss_z = (loss - ls.mean) / std::max(ls.std, 1e-8);
    v.grad_norm_z = (grad_norm - gs.mean) / std::max(gs.std, 1e-8);
    v.loss_ratio_to_min = min_loss > 0 ? loss / min_loss : 0.0;
    const bool rose = loss - ls.mean >= config_.min_loss_increase || !std::isfinite(loss);
    auto flag = [&](bool hit, const char* why) {
      if (!hit || !rose) return;
      v.spike = true;
      v.reason += (v.reason.empty() ? "" : ",") + std::string(why);
    };
    flag(v.loss_z > config_.loss_z, "loss_z");
    flag(v.grad_norm_z > config_.grad_norm_z, "grad_norm_z");
    flag(config_.min_loss_ratio > 0 && v.loss_ratio_to_min > config_.min_loss_ratio, "min_loss_ratio");
  }
  if (!v.spike && std::isfinite(loss) && std::isfinite(grad_norm)) {
    window_.emplace_back(loss, grad_norm);
    while (static_cast<int64_t>(window_.size()) > config_.window) window_.pop_front();
  }
  return v;
}

std::string SpikeMonitor::Serialize() const {
  std::ostringstream out;
  out.precision(17);
  for (const auto& [l, g] : window_) out << l << "," << g << ";";
  return out.str();
}

void SpikeMonitor::Restore(const std::string& text) {
  window_.clear();
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ';')) {
    const auto comma = item.find(',');
    if (comma == std::string::npos) continue;
    window_.emplace_back(std::stod(item.substr(0, comma)), std::stod(item.substr(comma + 1)));
  }
}

}  // namespace darkformer
