#include "train/clip_grad_norm.h"

#include <limits>
#include <map>
#include <string>
#include <utility>

namespace darkformer {

torch::Tensor ClipGradNorm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  // The multi-tensor kernels take one device and one dtype per call.
  std::map<std::pair<std::string, torch::ScalarType>, std::vector<torch::Tensor>> groups;
  std::vector<std::pair<std::string, torch::ScalarType>> order;  // first-seen order: norms summed alike every run
  for (const auto& p : parameters) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    const auto key = std::make_pair(g.device().str(), g.scalar_type());
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(g);
  }
  if (order.empty()) return torch::zeros({}, torch::kFloat);
  const auto device = groups[order.front()].front().device();
  std::vector<torch::Tensor> norms;
  for (const auto& key : order) {
    // bf16 gradients' norms are summed in fp32; fp64 ones keep fp64.
    const auto dtype = torch::promote_types(key.second, torch::kFloat);
    for (auto& n : at::_foreach_norm(groups[key], 2, dtype)) norms.push_back(n.to(device));
  }
  const auto total = torch::linalg_vector_norm(torch::stack(norms), 2);
  if (max_norm == std::numeric_limits<double>::infinity()) return total;  // no clip: the scale would be 1
  const auto scale = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
  for (const auto& key : order) at::_foreach_mul_(groups[key], scale.to(groups[key].front().device()));
  return total;
}

}  // namespace darkformer
