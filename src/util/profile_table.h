// The self-time table of a profiled run: per op, its own time (its span minus the ops it called)
// and its call count, summed over threads, the largest first (kernel-check --bench --profile).
#pragma once

#include <string>

namespace torch::autograd::profiler {
struct ProfilerResult;
}

namespace darkformer {

// Prints `title`, the totals and the top `rows` ops of `result` to stdout.
void PrintSelfTimeTable(const torch::autograd::profiler::ProfilerResult& result, const std::string& title,
                        size_t max_rows = 25);

}  // namespace darkformer
