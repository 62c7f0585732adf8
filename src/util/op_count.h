// Ops dispatched by a piece of code, counted with LibTorch's profiler: the proxy for kernel
// launches that the CPU can measure (each compute op is one launch or more on a GPU).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace darkformer {

struct OpCount {
  // Compute ops: aten ops that do work themselves, not through another counted op they call
  // (matmul counts once, as its bmm; a reshape that copies counts its copy). Views, metadata and
  // allocations (view, transpose, narrow, expand, empty, ...) launch nothing and are not counted.
  int64_t compute = 0;
  // Every aten op event, nested ones and views included.
  int64_t all = 0;
  std::map<std::string, int64_t> compute_by_name;  // the compute ops, by name
};

// Runs fn once under the profiler (CPU activities, every thread) and counts its ops.
OpCount CountDispatchedOps(const std::function<void()>& fn);

}  // namespace darkformer
