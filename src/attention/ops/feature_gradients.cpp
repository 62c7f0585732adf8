// The features' side of the whole-sequence forms (see feature_gradients.h).
#include "attention/ops/feature_gradients.h"

#include "util/error.h"

namespace darkformer::causal_ops {

torch::Tensor PerRow(const torch::Tensor& t_BKLX, int64_t rows) {
  return t_BKLX.size(1) == rows ? t_BKLX : t_BKLX.repeat_interleave(rows / t_BKLX.size(1), 1);
}

torch::Tensor PerKvHead(const torch::Tensor& t_BRLX, int64_t kv_heads) {
  if (t_BRLX.size(1) == kv_heads) return t_BRLX;
  return t_BRLX.reshape({t_BRLX.size(0), kv_heads, t_BRLX.size(1) / kv_heads, t_BRLX.size(2), t_BRLX.size(3)}).sum(2);
}

bool MapsInputs(const FeatureMap& map) { return map.input_map || map.input_scale != 1.0; }

std::pair<torch::Tensor, torch::Tensor> MappedInputs(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                     const torch::Tensor& x, const torch::Tensor& y) {
  if (map.input_map) {
    const auto a_1NDR = p.at(1).to(x.scalar_type());
    return {torch::matmul(x, a_1NDR), torch::matmul(y, a_1NDR)};
  }
  if (map.input_scale != 1.0) return {x * map.input_scale, y * map.input_scale};
  return {x, y};
}

FeatureMap WithoutInputMap(const FeatureMap& map) {
  FeatureMap plain = map;
  if (map.input_map) plain.params = {map.params.at(0)};
  plain.input_map = false;
  plain.input_scale = 1.0;
  return plain;
}

std::pair<torch::Tensor, torch::Tensor> LogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                    const torch::Tensor& x_in, const torch::Tensor& y_in) {
  DF_CHECK(map.positive_features || !MapsInputs(map), "an input map needs positive features");
  const auto [x, y] = MappedInputs(map, p, x_in, y_in);
  if (!map.positive_features) return {map.log_features(x, p, /*is_query=*/true), map.log_features(y, p, /*is_query=*/false)};
  const auto w_DM = p.at(0).detach().to(x.scalar_type()).t();
  auto lk = torch::matmul(y, w_DM);
  lk.sub_((y * y).sum(-1, /*keepdim=*/true), /*alpha=*/0.5);
  return {torch::matmul(x, w_DM), lk};
}

FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                             const torch::Tensor& y, const torch::Tensor& dlq_BHLM, const torch::Tensor& dlk_BRLM);

namespace {

// FeatureBackward of a map that maps its inputs: the features' backward at the mapped inputs
// (recomputed), then through the map: dx = dx' A^T, dA = sum x^T dx' + y^T dy' over the batch (and
// the heads where A is shared); or dx = s dx'.
FeatureGrads MappedInputsBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x_in,
                                  const torch::Tensor& y_in, const torch::Tensor& dlq_BHLM,
                                  const torch::Tensor& dlk_BRLM) {
  torch::NoGradGuard no_grad;
  const auto dtype = dlq_BHLM.scalar_type();
  if (!map.input_map) {
    // Scaled copies in the gradients' dtype (one tensor each, whatever the inputs' dtype).
    auto scaled = [&](const torch::Tensor& t) {
      return t.to(dtype, /*non_blocking=*/false, /*copy=*/true).mul_(map.input_scale);
    };
    auto g = FeatureBackward(WithoutInputMap(map), {p.at(0)}, scaled(x_in), scaled(y_in), dlq_BHLM, dlk_BRLM);
    g.dx.mul_(map.input_scale);
    g.dy.mul_(map.input_scale);
    return g;
  }
  const auto x = x_in.to(dtype), y = y_in.to(dtype);
  auto g = [&] {
    const auto [xm, ym] = MappedInputs(map, p, x, y);
    return FeatureBackward(WithoutInputMap(map), {p.at(0)}, xm, ym, dlq_BHLM, dlk_BRLM);
  }();
  const auto a_1NDR = p.at(1).detach().to(dtype);
  if (p[1].requires_grad()) {
    const bool shared = a_1NDR.size(1) == 1;
    auto summed = [&](const torch::Tensor& in, const torch::Tensor& d) {
      const auto t = torch::matmul(in.transpose(-1, -2), d);
      return shared ? t.sum(std::vector<int64_t>{0, 1}, /*keepdim=*/true) : t.sum(0, /*keepdim=*/true);
    };
    g.params.push_back(summed(x, g.dx).add_(summed(y, g.dy)).to(p[1].scalar_type()));
  } else {
    g.params.push_back({});
  }
  const auto a_1NRD = a_1NDR.transpose(-1, -2);
  g.dx = torch::matmul(g.dx, a_1NRD);
  g.dy = torch::matmul(g.dy, a_1NRD);
  return g;
}

}  // namespace

FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x_in,
                             const torch::Tensor& y_in, const torch::Tensor& dlq_BHLM, const torch::Tensor& dlk_BRLM) {
  if (MapsInputs(map)) return MappedInputsBackward(map, p, x_in, y_in, dlq_BHLM, dlk_BRLM);
  const auto x = x_in.to(dlq_BHLM.scalar_type()), y = y_in.to(dlq_BHLM.scalar_type());
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
