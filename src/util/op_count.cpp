// Op counting with LibTorch's profiler (see op_count.h).
#include "util/op_count.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace darkformer {

namespace {

// Ops that only make a new view of existing memory, read metadata or allocate: no launch.
bool LaunchesNothing(const std::string& name) {
  static const std::set<std::string> names = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::unsqueeze",
      "aten::squeeze", "aten::transpose", "aten::t", "aten::permute", "aten::expand", "aten::expand_as",
      "aten::select", "aten::narrow", "aten::slice", "aten::as_strided", "aten::alias", "aten::detach",
      "aten::detach_", "aten::lift_fresh", "aten::empty", "aten::empty_like", "aten::empty_strided",
      "aten::resize_", "aten::contiguous", "aten::to", "aten::_to_copy", "aten::clone", "aten::split",
      "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::view_as", "aten::reshape_as",
      "aten::flatten", "aten::unflatten", "aten::set_", "aten::result_type", "aten::zeros", "aten::zeros_like",
      "aten::ones", "aten::ones_like", "aten::full", "aten::matmul", "aten::linear", "aten::pad",
      "aten::constant_pad_nd", "aten::repeat_interleave", "aten::type_as", "aten::numpy_T", "aten::mT",
      "aten::resolve_conj", "aten::resolve_neg", "aten::conj", "aten::_conj", "aten::new_empty_strided",
      "aten::new_empty", "aten::_has_compatible_shallow_copy_type", "aten::is_nonzero"};
  return names.count(name) > 0;
}

struct Node {
  uint64_t start, end;
  std::string name;
  bool scalar;  // every input 0-dim: a wrapped number's conversion, host-side on a GPU too
  std::vector<size_t> children;
};

bool ScalarOnly(c10::ArrayRef<std::vector<int64_t>> shapes) {
  bool any = false;
  for (const auto& shape : shapes) {
    if (!shape.empty()) return false;
    any = true;
  }
  return any;
}

}  // namespace

OpCount CountDispatchedOps(const std::function<void()>& fn) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const std::set<ActivityType> activities = {ActivityType::CPU};
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  fn();
  const auto result = prof::disableProfiler();
  // Events nest by [start, end) per thread: rebuild each thread's tree.
  std::map<uint64_t, std::vector<Node>> by_thread;
  for (const auto& e : result->events()) {
    by_thread[e.startThreadId()].push_back({e.startNs(), e.endNs(), e.name(), ScalarOnly(e.shapes()), {}});
  }
  OpCount count;
  for (auto& [thread, nodes] : by_thread) {
    std::sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<size_t> stack, roots;
    for (size_t i = 0; i < nodes.size(); ++i) {
      while (!stack.empty() && nodes[stack.back()].end <= nodes[i].start) stack.pop_back();
      (stack.empty() ? roots : nodes[stack.back()].children).push_back(i);
      stack.push_back(i);
    }
    // Post-order: an aten op counts when it is a compute op on a tensor (not only 0-dim inputs)
    // and no descendant counted.
    std::function<bool(size_t)> visit = [&](size_t i) {
      bool below = false;
      for (const size_t c : nodes[i].children) below = visit(c) || below;
      const bool aten = nodes[i].name.rfind("aten::", 0) == 0;
      if (aten) ++count.all;
      if (aten && !below && !nodes[i].scalar && !LaunchesNothing(nodes[i].name)) {
        ++count.compute;
        ++count.compute_by_name[nodes[i].name];
        return true;
      }
      return below;
    };
    for (const size_t r : roots) visit(r);
  }
  return count;
}

}  // namespace darkformer
