// The features' side of the whole-sequence forms (see feature_gradients.h).
#include "attention/ops/feature_gradients.h"

#include "attention/ops/fp32_products.h"
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

torch::Tensor MappedInput(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                          torch::ScalarType dtype) {
  if (map.input_map) return Fp32Matmul(x.to(dtype), p.at(1).to(dtype));
  if (map.input_scale == 1.0) return x.to(dtype);
  // Converted and scaled in one fresh tensor (outside autograd, in place).
  if (!torch::GradMode::is_enabled()) return x.to(dtype, /*non_blocking=*/false, /*copy=*/true).mul_(map.input_scale);
  return x.to(dtype) * map.input_scale;
}

std::pair<torch::Tensor, torch::Tensor> MappedInputs(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                     const torch::Tensor& x, const torch::Tensor& y) {
  return {MappedInput(map, p, x, x.scalar_type()), MappedInput(map, p, y, y.scalar_type())};
}

FeatureMap WithoutInputMap(const FeatureMap& map) {
  FeatureMap plain = map;
  if (map.input_map) plain.params = {map.params.at(0)};
  plain.input_map = false;
  plain.input_scale = 1.0;
  return plain;
}

torch::Tensor SideLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& in,
                              torch::ScalarType dtype, bool is_query) {
  DF_CHECK(map.positive_features || !MapsInputs(map), "an input map needs positive features");
  if (!map.positive_features) return map.log_features(in.to(dtype), p, is_query);
  const auto w_DM = p.at(0).detach().to(dtype).t();
  const auto mapped = MappedInput(map, p, in, dtype);
  auto features = Fp32Matmul(mapped, w_DM);
  if (!is_query) features.sub_((mapped * mapped).sum(-1, /*keepdim=*/true), /*alpha=*/0.5);
  return features;
}

std::pair<torch::Tensor, torch::Tensor> LogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                    const torch::Tensor& x, const torch::Tensor& y) {
  return {SideLogFeatures(map, p, x, x.scalar_type(), /*is_query=*/true),
          SideLogFeatures(map, p, y, y.scalar_type(), /*is_query=*/false)};
}

namespace {

// One side (queries or keys) of the positive features' closed form (FeatureMap::positive_features):
// d in = (d log phi) W - in sum_m (d log phi), in place (no second temporary of its size), and
// dW += (d log phi)^T in where dw is given (undefined: this side makes it).
torch::Tensor PositiveSideBackward(const torch::Tensor& w_MD, const torch::Tensor& in, const torch::Tensor& dl,
                                   torch::Tensor* dw) {
  auto d_in = Fp32Matmul(dl, w_MD).addcmul_(in, dl.sum(-1, /*keepdim=*/true), -1);
  if (dw != nullptr) {
    const int64_t m = w_MD.size(0), d = w_MD.size(1);
    const auto dl_m = dl.reshape({-1, m}).t(), in_d = in.reshape({-1, d});
    *dw = !dw->defined() ? Fp32Matmul(dl_m, in_d)
          : SplitsForTf32(dl_m, in_d) ? dw->add_(SplitMatmul(dl_m, in_d))
                                      : dw->addmm_(dl_m, in_d);
  }
  return d_in;
}

// FeatureBackward of positive features whose inputs are mapped (FeatureMap::input_map,
// input_scale), one side after the other, each mapped again from the inputs as given and released
// with its feature gradients, so no more than one side's L x D tensors live at once: the closed
// form at the mapped inputs, then through the map: d in = d in' A^T and dA = sum in^T d in' over
// the batch (and the heads where A is shared), or d in = s d in'. With queries_mapped, dlq is
// already the queries' d in' (FeatureBackwardFromMappedQueries). Keys given once per KV head
// (y_in B x K x L x D against dlk per key row, B x R x L x m, R = K G) are taken grouped, B x K x G:
// no key is repeated per row, and dy comes per KV head, each the sum over its G rows. With
// dx_as_input, dx comes in x_in's dtype, converted before the keys' side runs (FeatureBackwardFromMappedQueries).
FeatureGrads MappedInputsBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x_in,
                                  const torch::Tensor& y_in, torch::Tensor dlq_BHLM, torch::Tensor dlk_BRLM,
                                  bool queries_mapped, bool dx_as_input = false) {
  torch::NoGradGuard no_grad;
  const auto dtype = dlq_BHLM.scalar_type();
  const auto w_MD = p.at(0).detach().to(dtype);
  const auto a_1NDR = map.input_map ? p.at(1).detach().to(dtype) : torch::Tensor();
  const bool want_w = p[0].requires_grad(), want_a = map.input_map && p[1].requires_grad();
  torch::Tensor dw, da;
  auto side = [&](const torch::Tensor& in_as_given, torch::Tensor& dl, bool mapped) {
    if (!map.input_map) {
      // MappedInput outside autograd: one scaled copy in the gradients' dtype.
      auto d_in = mapped ? std::move(dl)
                         : PositiveSideBackward(w_MD, MappedInput(map, p, in_as_given, dtype), dl,
                                                want_w ? &dw : nullptr);
      dl = torch::Tensor();
      return d_in.mul_(map.input_scale);
    }
    // The input in the gradients' dtype where it is read, and freed before d in is made.
    auto in = mapped && !want_a ? torch::Tensor() : in_as_given.to(dtype);
    const auto d_mapped =
        mapped ? std::move(dl) : PositiveSideBackward(w_MD, MappedInput(map, p, in, dtype), dl, want_w ? &dw : nullptr);
    dl = torch::Tensor();
    if (want_a) {
      const auto t = Fp32Matmul(in.transpose(-1, -2), d_mapped);
      const auto part = a_1NDR.size(1) == 1 ? t.sum(std::vector<int64_t>{0, 1}, /*keepdim=*/true)
                                            : t.sum(0, /*keepdim=*/true);
      da = da.defined() ? da.add_(part) : part;
    }
    in = torch::Tensor();
    return Fp32Matmul(d_mapped, a_1NDR.transpose(-1, -2));
  };
  auto grouped_keys = [&](const torch::Tensor& y_BKLD, torch::Tensor& dl) {
    const int64_t batch = dl.size(0), kv = y_BKLD.size(1), group = dl.size(1) / kv, length = dl.size(2);
    const auto in = y_BKLD.to(dtype).unsqueeze(2);  // B x K x 1 x L x D
    // A per query head (N = R) as K x G of them; shared A and a scale map every row's keys alike.
    const bool per_row = map.input_map && a_1NDR.size(1) > 1;
    DF_CHECK(!per_row || a_1NDR.size(1) == kv * group,
             "the input map has " << a_1NDR.size(1) << " heads for " << kv * group << " key rows");
    const auto a_KGDR =
        per_row ? a_1NDR[0].view({1, kv, group, a_1NDR.size(2), a_1NDR.size(3)}) : torch::Tensor();
    auto mapped_keys = [&] {  // B x K x (G|1) x L x R
      return !map.input_map ? in * map.input_scale : Fp32Matmul(in, per_row ? a_KGDR : a_1NDR[0][0]);
    };
    auto d_mapped = [&] {
      if (want_w) {
        const auto mapped = mapped_keys();
        return PositiveSideBackward(w_MD, mapped.expand({batch, kv, group, length, mapped.size(4)}),
                                    dl.view({batch, kv, group, length, dl.size(3)}), &dw);
      }
      // PositiveSideBackward's very ops, with dl freed before the mapped keys are made (W takes no
      // gradient, so they are not needed beside dl): d in' = dl W - in' sum_m dl.
      torch::Tensor sums, d_in;
      {
        const auto dl_grouped = dl.view({batch, kv, group, length, dl.size(3)});
        sums = dl_grouped.sum(-1, /*keepdim=*/true);
        d_in = Fp32Matmul(dl_grouped, w_MD);
      }
      dl = torch::Tensor();
      return d_in.addcmul_(mapped_keys(), sums, -1);
    }();
    dl = torch::Tensor();
    if (!map.input_map) return d_mapped.sum(2).mul_(map.input_scale);
    if (want_a) {
      const auto t = Fp32Matmul(in.transpose(-1, -2), d_mapped);  // B x K x G x D x R
      const auto part = per_row ? t.sum(0).view({1, kv * group, t.size(3), t.size(4)})
                                : t.sum(std::vector<int64_t>{0, 1, 2}).view({1, 1, t.size(3), t.size(4)});
      da = da.defined() ? da.add_(part) : part;
    }
    if (!per_row) return Fp32Matmul(d_mapped.sum(2), a_1NDR[0][0].t());
    return Fp32Matmul(d_mapped, a_KGDR.transpose(-1, -2)).sum(2);
  };
  FeatureGrads g;
  g.dx = side(x_in, dlq_BHLM, queries_mapped);
  if (dx_as_input) g.dx = g.dx.to(x_in.scalar_type());
  g.dy = y_in.size(1) == dlk_BRLM.size(1) ? side(y_in, dlk_BRLM, false) : grouped_keys(y_in, dlk_BRLM);
  g.params = {want_w ? dw.to(p[0].scalar_type()) : torch::Tensor()};
  if (map.input_map) g.params.push_back(want_a ? da.to(p[1].scalar_type()) : torch::Tensor());
  return g;
}

}  // namespace

FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x_in,
                             const torch::Tensor& y_in, torch::Tensor dlq_BHLM, torch::Tensor dlk_BRLM) {
  if (MapsInputs(map)) {
    return MappedInputsBackward(map, p, x_in, y_in, std::move(dlq_BHLM), std::move(dlk_BRLM), /*queries_mapped=*/false);
  }
  const auto x = x_in.to(dlq_BHLM.scalar_type()), y = y_in.to(dlq_BHLM.scalar_type());
  FeatureGrads g;
  g.params.resize(p.size());
  if (map.positive_features) {
    // log phi = x W^T - |x|^2/2 - log(m)/2 (FeatureMap::positive_features).
    const auto w_MD = p.at(0).detach().to(x.scalar_type());
    torch::Tensor dw;
    torch::Tensor* want_w = p[0].requires_grad() ? &dw : nullptr;
    g.dx = PositiveSideBackward(w_MD, x, dlq_BHLM, want_w);
    g.dy = PositiveSideBackward(w_MD, y, dlk_BRLM, want_w);
    if (want_w != nullptr) g.params[0] = dw.to(p[0].scalar_type());
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

FeatureGrads FeatureBackwardFromMappedQueries(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                              const torch::Tensor& x_in, const torch::Tensor& y_in,
                                              torch::Tensor dxq_BHLR, torch::Tensor dlk_BRLM) {
  DF_CHECK(map.positive_features && !p.at(0).requires_grad(),
           "the queries' mapped gradient needs positive features whose W takes no gradient");
  if (MapsInputs(map)) {
    return MappedInputsBackward(map, p, x_in, y_in, std::move(dxq_BHLR), std::move(dlk_BRLM), /*queries_mapped=*/true,
                                /*dx_as_input=*/true);
  }
  torch::NoGradGuard no_grad;
  FeatureGrads g;
  g.params.resize(p.size());
  g.dx = dxq_BHLR.to(x_in.scalar_type());
  dxq_BHLR = torch::Tensor();
  const auto w_MD = p[0].detach().to(dlk_BRLM.scalar_type());
  g.dy = PositiveSideBackward(w_MD, PerRow(y_in, dlk_BRLM.size(1)).to(dlk_BRLM.scalar_type()), dlk_BRLM, nullptr);
  return g;
}

}  // namespace darkformer::causal_ops
