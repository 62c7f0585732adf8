// The self-time table of a profiled run (see profile_table.h).
#include "util/profile_table.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <vector>

namespace darkformer {

void PrintSelfTimeTable(const torch::autograd::profiler::ProfilerResult& result, const std::string& title,
                        size_t max_rows) {
  // Self time: per thread, events nest by [start, end); subtract each event's direct children.
  struct Span {
    uint64_t start, end;
    std::string name;
  };
  std::map<uint64_t, std::vector<Span>> by_thread;
  for (const auto& e : result.events()) by_thread[e.startThreadId()].push_back({e.startNs(), e.endNs(), e.name()});
  std::map<std::string, std::pair<double, int64_t>> self;  // ms, calls
  for (auto& [thread, spans] : by_thread) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<std::pair<const Span*, double>> stack;  // open spans and their children's time
    auto close = [&](uint64_t until) {
      while (!stack.empty() && stack.back().first->end <= until) {
        const auto [span, children] = stack.back();
        stack.pop_back();
        const double ms = (span->end - span->start) * 1e-6;
        auto& entry = self[span->name];
        entry.first += ms - children;
        entry.second += 1;
        if (!stack.empty()) stack.back().second += ms;
      }
    };
    for (const auto& span : spans) {
      close(span.start);
      stack.push_back({&span, 0.0});
    }
    close(std::numeric_limits<uint64_t>::max());
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(self.begin(), self.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  int64_t calls = 0;
  for (const auto& row : rows) {
    total += row.second.first;
    calls += row.second.second;
  }
  std::cout << fmt::format("{}, {:.1f} ms self time over all threads, {} ops\n", title, total, calls);
  for (size_t i = 0; i < std::min(rows.size(), max_rows); ++i) {
    std::cout << fmt::format("  {:<44} {:>9.1f} ms {:>5.1f}% {:>8} calls\n", rows[i].first, rows[i].second.first,
                             100 * rows[i].second.first / total, rows[i].second.second);
  }
}


}  // namespace darkformer
