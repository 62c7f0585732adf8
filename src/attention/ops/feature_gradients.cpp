// The features' side of the whole-sequence forms (see feature_gradients.h).
#include "attention/ops/feature_gradients.h"

namespace darkformer::causal_ops {

torch::Tensor PerRow(const torch::Tensor& t_BKLX, int64_t rows) {
  return t_BKLX.size(1) == rows ? t_BKLX : t_BKLX.repeat_interleave(rows / t_BKLX.size(1), 1);
}

torch::Tensor PerKvHead(const torch::Tensor& t_BRLX, int64_t kv_heads) {
  if (t_BRLX.size(1) == kv_heads) return t_BRLX;
  return t_BRLX.reshape({t_BRLX.size(0), kv_heads, t_BRLX.size(1) / kv_heads, t_BRLX.size(2), t_BRLX.size(3)}).sum(2);
}

std::pair<torch::Tensor, torch::Tensor> LogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                    const torch::Tensor& x, const torch::Tensor& y) {
  if (!map.positive_features) return {map.log_features(x, p, /*is_query=*/true), map.log_features(y, p, /*is_query=*/false)};
  const auto w_DM = p.at(0).detach().to(x.scalar_type()).t();
  auto lk = torch::matmul(y, w_DM);
  lk.sub_((y * y).sum(-1, /*keepdim=*/true), /*alpha=*/0.5);
  return {torch::matmul(x, w_DM), lk};
}

FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                             const torch::Tensor& y, const torch::Tensor& dlq_BHLM, const torch::Tensor& dlk_BRLM) {
  FeatureGrads g;
  g.params.resize(p.size());
  if (map.positive_features) {
    // log phi = x W^T - |x|^2/2 - log(m)/2 (FeatureMap::positive_features).
    const auto w_MD = p.at(0).detach().to(x.scalar_type());
    // In place: no second L x D temporary beside the gradient.
    g.dx = torch::matmul(dlq_BHLM, w_MD).addcmul_(x, dlq_BHLM.sum(-1, /*keepdim=*/true), -1);
    g.dy = torch::matmul(dlk_BRLM, w_MD).addcmul_(y, dlk_BRLM.sum(-1, /*keepdim=*/true), -1);
    if (p[0].requires_grad()) {
      const int64_t m = w_MD.size(0), d = w_MD.size(1);
      g.params[0] = torch::matmul(dlq_BHLM.reshape({-1, m}).t(), x.reshape({-1, d}))
                        .addmm_(dlk_BRLM.reshape({-1, m}).t(), y.reshape({-1, d}))
                        .to(p[0].scalar_type());
    }
    return g;
  }
  // Any other map: its own backward, once over the whole sequence.
  torch::AutoGradMode grad_on(true);
  const auto x_leaf = x.detach().requires_grad_(), y_leaf = y.detach().requires_grad_();
  std::vector<torch::Tensor> leaves, inputs = {x_leaf, y_leaf};
  std::vector<size_t> which;
  for (size_t i = 0; i < p.size(); ++i) {
    leaves.push_back(p[i].detach().requires_grad_(p[i].requires_grad()));
    if (p[i].requires_grad()) {
      inputs.push_back(leaves.back());
      which.push_back(i);
    }
  }
  const auto lq = map.log_features(x_leaf, leaves, /*is_query=*/true);
  const auto lk = map.log_features(y_leaf, leaves, /*is_query=*/false);
  const auto grads = torch::autograd::grad({lq, lk}, inputs, {dlq_BHLM, dlk_BRLM}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
  g.dx = grads[0].defined() ? grads[0] : torch::zeros_like(x);
  g.dy = grads[1].defined() ? grads[1] : torch::zeros_like(y);
  for (size_t n = 0; n < which.size(); ++n) g.params[which[n]] = grads[n + 2];
  return g;
}

}  // namespace darkformer::causal_ops
