// The chunk loop (see chunk_loop.h).
#include "attention/ops/chunk_loop.h"

#include <algorithm>
#include <optional>

#include "attention/ops/dtype_probe.h"
#include "attention/ops/fp32_products.h"
#include "attention/ops/per_feature_chunks.h"

namespace darkformer::causal_ops {

namespace {

// Leaf copies of the map's parameters for a recomputation whose gradient we want.
std::vector<torch::Tensor> ParamLeaves(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> leaves;
  for (const auto& p : params) leaves.push_back(p.detach().requires_grad_(p.requires_grad()));
  return leaves;
}

// Gradients of `out` (given d_out) w.r.t. the input leaf and the parameter leaves that need one;
// parameter gradients are added into param_grads.
torch::Tensor BackpropChunk(const torch::Tensor& out, const torch::Tensor& d_out, const torch::Tensor& input_leaf,
                            const std::vector<torch::Tensor>& leaves, std::vector<torch::Tensor>& param_grads) {
  std::vector<torch::Tensor> inputs = {input_leaf};
  std::vector<size_t> which;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].requires_grad()) {
      inputs.push_back(leaves[i]);
      which.push_back(i);
    }
  }
  const auto grads = torch::autograd::grad({out}, inputs, {d_out}, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
  for (size_t n = 0; n < which.size(); ++n) {
    const auto& g = grads[n + 1];
    if (!g.defined()) continue;
    auto& acc = param_grads[which[n]];
    acc = acc.defined() ? acc + g : g;
  }
  return grads[0].defined() ? grads[0] : torch::zeros_like(input_leaf);
}

// Closed-form backward of positive features (FeatureMap::positive_features) given d log phi of
// inputs x_NCD: dx = dl W - x sum_m dl when the log-features carry -|x|^2/2 (keys), dl W when
// they do not (queries: a per-query shift, which cancels); adds dW = dl^T x into dw (nullptr: W
// needs no gradient).
torch::Tensor PositiveFeatureBackward(const torch::Tensor& dl_NCM, const torch::Tensor& x_NCD, const torch::Tensor& w_MD,
                                      bool with_norm, torch::Tensor* dw) {
  auto dx_NCD = Fp32Matmul(dl_NCM, w_MD);
  if (with_norm) dx_NCD.sub_(x_NCD * dl_NCM.sum(-1, /*keepdim=*/true));
  if (dw != nullptr) {
    const int64_t m = dl_NCM.size(-1), d = x_NCD.size(-1);
    const auto g_MD = Fp32Matmul(dl_NCM.reshape({-1, m}).t(), x_NCD.reshape({-1, d}));
    *dw = dw->defined() ? *dw + g_MD : g_MD;
  }
  return dx_NCD;
}

// Log-features of a chunk, up to what cancels. Positive features (FeatureMap::positive_features):
// x W^T for queries (their -|x|^2/2 - log(m)/2 shifts every argument of the query, s_t's too)
// and y W^T - |y|^2/2 for keys (-log(m)/2 shifts every key: R and s with it). Other maps: their
// log_features. Queries 1 x R x G x C x M, keys 1 x R x C x M.
class ChunkLogFeatures {
 public:
  ChunkLogFeatures(const FeatureMap& map, const Layout& l, const torch::Tensor& like) : map_(map), l_(l) {
    if (map.positive_features) {
      DF_CHECK(map.params.size() == 1 && map.params[0].dim() == 2,
               "FusedCausalLinearAttention: positive_features wants one shared W (m x D), got " << map.params.size()
                                                                                                << " parameter(s)");
      w_DM_ = map.params[0].detach().to(like.scalar_type()).t();
    }
  }
  torch::Tensor Queries(const torch::Tensor& x_1HCD, const std::vector<torch::Tensor>& params) const {
    const auto lq = map_.positive_features ? Fp32Matmul(x_1HCD, w_DM_)
                                           : map_.log_features(x_1HCD, params, /*is_query=*/true);
    RecordDtype(ProbeField::kFeatures, lq);
    return lq.view({1, l_.kv_heads, l_.group, x_1HCD.size(2), lq.size(-1)});
  }
  torch::Tensor Keys(const torch::Tensor& y_1RCD, const std::vector<torch::Tensor>& params) const {
    if (!map_.positive_features) return map_.log_features(y_1RCD, params, /*is_query=*/false);
    return Fp32Matmul(y_1RCD, w_DM_).sub_((y_1RCD * y_1RCD).sum(-1, /*keepdim=*/true), /*alpha=*/0.5);
  }

 private:
  const FeatureMap& map_;
  const Layout& l_;
  torch::Tensor w_DM_;
};

// One chunk as per_feature_chunks.h's block (N = 1): queries lq_1RGCM, keys lk_1RCM, values
// v_1RCD; prev_1RM: R(e') (undefined for the first chunk).
ChunkBlock MakeBlock(const torch::Tensor& lq_1RGCM, const torch::Tensor& lk_1RCM, const torch::Tensor& v_1RCD,
                     const torch::Tensor& prev_1RM) {
  const int64_t r = lk_1RCM.size(1), c = lk_1RCM.size(2), m = lk_1RCM.size(3), g = lq_1RGCM.size(2);
  ChunkBlock b;
  b.group = g;
  b.sub = SubChunk(c);
  const int64_t u = c / b.sub;
  b.a_BRNUGSM = lq_1RGCM.reshape({1, r, g, u, b.sub, m}).permute({0, 1, 3, 2, 4, 5}).contiguous().unsqueeze(2);
  b.l_BRNCM = lk_1RCM.unsqueeze(2);
  b.vh_BRNCV = WithOnes(v_1RCD);
  auto r_1RCM = std::get<0>(lk_1RCM.cummax(2));
  if (prev_1RM.defined()) r_1RCM = torch::maximum(r_1RCM, prev_1RM.unsqueeze(2));
  b.r_BRNCM = r_1RCM.unsqueeze(2);
  b.prev_BRNM = (prev_1RM.defined() ? prev_1RM : r_1RCM.select(2, 0)).unsqueeze(2);
  return b;
}

// A chunk's n (1 R 1 Q V) back in the unit's query layout: 1 x R x G x C x X.
torch::Tensor ByHead(const torch::Tensor& t_1R1QX, const ChunkBlock& b, int64_t c) {
  const int64_t r = t_1R1QX.size(1), x = t_1R1QX.size(-1);
  return t_1R1QX.view({1, r, c / b.sub, b.group, b.sub, x}).permute({0, 1, 3, 2, 4, 5}).reshape({1, r, b.group, c, x});
}
// The unit's query-layout tensor of a chunk (1 x R x G x C x X) as the block's rows: 1 R 1 Q X.
torch::Tensor ByBlock(const torch::Tensor& t_1RGCX, const ChunkBlock& b) {
  const int64_t r = t_1RGCX.size(1), c = t_1RGCX.size(3), x = t_1RGCX.size(-1);
  return t_1RGCX.reshape({1, r, b.group, c / b.sub, b.sub, x}).permute({0, 1, 3, 2, 4, 5}).reshape({1, r, 1, -1, x});
}

// The state after folding a chunk: the old rows decay to the chunk's last R, its keys join.
torch::Tensor Fold(const torch::Tensor& sin_1R1MV, const ChunkBlock& b) {
  const auto kend = KeysAtChunkEnd(b);
  const auto own = torch::matmul(kend.transpose(-1, -2), b.vh_BRNCV);
  if (!sin_1R1MV.defined()) return own;
  const auto decay = (b.prev_BRNM - b.r_BRNCM.select(3, b.r_BRNCM.size(3) - 1)).exp_().unsqueeze(-1);
  return own.add_(sin_1R1MV * decay);
}

}  // namespace

void ForwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                 const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size, torch::Tensor out_1KGLD,
                 torch::Tensor den_1KGL) {
  // Nothing here is recorded (the custom function's forward): InferenceMode also skips the
  // version counters and view tracking of the small ops per chunk.
  c10::InferenceMode inference;
  const ChunkLogFeatures features(map, l, x_1HLD);
  torch::Tensor state_1R1MV, prev_1RM;
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto lq = features.Queries(x_1HLD.narrow(2, start, c), p);
    const auto lk = features.Keys(y_1KLD.narrow(2, start, c), p);
    const auto b = MakeBlock(lq, lk, v_1KLD.narrow(2, start, c), prev_1RM);
    const auto terms = BuildChunkTerms(b);
    const auto n = ByHead(ChunkNumerator(b, terms, state_1R1MV), b, c);  // 1 R G C V
    const auto den = n.select(-1, l.value_dim);                          // >= 1
    auto out_chunk = out_1KGLD.narrow(3, start, c);
    torch::div_out(out_chunk, n.narrow(-1, 0, l.value_dim), den.unsqueeze(-1));
    den_1KGL.narrow(3, start, c).copy_(den);
    if (start + c < l.length) {
      state_1R1MV = Fold(state_1R1MV, b);
      RecordDtype(ProbeField::kState, state_1R1MV);
    }
    prev_1RM = b.r_BRNCM.select(3, c - 1).squeeze(2);
  }
}

std::vector<torch::Tensor> BackwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& params, const Layout& l,
                                        const UnitSaved& s, int64_t chunk_size, torch::Tensor dx_1HLD,
                                        torch::Tensor dy_1KLD, torch::Tensor dv_1KLD) {
  std::vector<torch::Tensor> param_grads(params.size());
  // Closed-form feature gradients (FeatureMap::positive_features): nothing here is recorded.
  const bool closed = map.positive_features;
  std::optional<c10::InferenceMode> inference;
  if (closed) inference.emplace();
  const ChunkLogFeatures features(map, l, s.x_1HLD);
  torch::Tensor w_MD;
  torch::Tensor* dw = nullptr;
  if (closed) {
    w_MD = params[0].detach().to(s.x_1HLD.scalar_type());
    if (params[0].requires_grad()) dw = &param_grads[0];
  }
  std::vector<int64_t> starts;
  for (int64_t start = 0; start < l.length; start += chunk_size) starts.push_back(start);
  auto chunk_len = [&](int64_t start) { return std::min(chunk_size, l.length - start); };
  // R at each chunk's last position (1 R M), found by scan 1 for scan 2.
  std::vector<torch::Tensor> ends;
  auto end_at = [&](int64_t chunk) { return ends.at(chunk); };
  // h = dL/dn = [g / den, -(g . out) / den] of a chunk, in the block's rows.
  auto grad_n = [&](int64_t start, int64_t c, const ChunkBlock& b) {
    const auto g = s.g_1KGLD.narrow(3, start, c), out = s.out_1KGLD.narrow(3, start, c);
    const auto h = torch::cat({g, (g * out).sum(-1, /*keepdim=*/true).neg_()}, -1)
                       .div_(s.den_1KGL.narrow(3, start, c).unsqueeze(-1));
    return ByBlock(h, b);
  };

  // Scan 1, forward order: query gradients against the state.
  {
    torch::Tensor state_1R1MV;
    for (size_t chunk = 0; chunk < starts.size(); ++chunk) {
      const int64_t start = starts[chunk], c = chunk_len(start);
      const auto leaves = closed ? params : ParamLeaves(params);
      const auto x_leaf = s.x_1HLD.narrow(2, start, c).detach().requires_grad_(!closed);
      torch::Tensor lq;
      {
        torch::AutoGradMode grad_on(!closed);
        lq = features.Queries(x_leaf, leaves);
      }
      torch::NoGradGuard no_grad;
      const auto lk = features.Keys(s.y_1KLD.narrow(2, start, c), params);
      const auto b = MakeBlock(lq.detach(), lk, s.v_1KLD.narrow(2, start, c), chunk == 0 ? torch::Tensor() : end_at(chunk - 1));
      auto terms = BuildChunkTerms(b);
      ends.push_back(b.r_BRNCM.select(3, c - 1).squeeze(2));
      const auto q = ChunkQueryBackward(b, terms, grad_n(start, c, b), state_1R1MV);
      const int64_t m = lq.size(-1);
      const auto da_1RGCM = ByHead(q.da_BRNUGSM.reshape({1, l.kv_heads, 1, -1, m}), b, c);
      if (closed) {
        const auto x_NCD = x_leaf.reshape({-1, c, x_leaf.size(-1)});
        dx_1HLD.narrow(2, start, c)
            .copy_(PositiveFeatureBackward(da_1RGCM.reshape({-1, c, m}), x_NCD, w_MD, /*with_norm=*/false, dw)
                       .view_as(x_leaf));
      } else {
        torch::AutoGradMode grad_on(true);
        dx_1HLD.narrow(2, start, c).copy_(BackpropChunk(lq, da_1RGCM.view_as(lq), x_leaf, leaves, param_grads));
      }
      if (chunk + 1 < starts.size()) state_1R1MV = Fold(state_1R1MV, b);
    }
  }

  // Scan 2, reverse order: key and value gradients against the reverse state.
  torch::Tensor z_1R1MV;
  for (int64_t chunk = static_cast<int64_t>(starts.size()) - 1; chunk >= 0; --chunk) {
    const int64_t start = starts[chunk], c = chunk_len(start);
    const auto leaves = closed ? params : ParamLeaves(params);
    const auto y_leaf = s.y_1KLD.narrow(2, start, c).detach().requires_grad_(!closed);
    torch::Tensor lk;
    {
      torch::AutoGradMode grad_on(!closed);
      lk = features.Keys(y_leaf, leaves);
    }
    torch::NoGradGuard no_grad;
    const auto lq = features.Queries(s.x_1HLD.narrow(2, start, c), params);
    const auto b = MakeBlock(lq, lk.detach(), s.v_1KLD.narrow(2, start, c), chunk == 0 ? torch::Tensor() : end_at(chunk - 1));
    auto terms = BuildChunkTerms(b);
    const auto h = grad_n(start, c, b);
    const auto q = ChunkQueryBackward(b, terms, h, torch::Tensor());
    const auto kend = KeysAtChunkEnd(b);
    const auto k = ChunkKeyBackward(b, terms, q, h, kend, z_1R1MV);
    const auto dl_1RCM = k.dl_BRNCM.squeeze(2);
    if (closed) {
      dy_1KLD.narrow(2, start, c)
          .copy_(PositiveFeatureBackward(dl_1RCM, y_leaf, w_MD, /*with_norm=*/true, dw).view_as(y_leaf));
    } else {
      torch::AutoGradMode grad_on(true);
      dy_1KLD.narrow(2, start, c).copy_(BackpropChunk(lk, dl_1RCM.view_as(lk), y_leaf, leaves, param_grads));
    }
    dv_1KLD.narrow(2, start, c).copy_(k.dvh_BRNCV.squeeze(2).narrow(-1, 0, l.value_dim));
    if (chunk == 0) break;
    // Z for the chunk before: this chunk's T, and the later chunks' brought to R(e_{c-1}).
    const auto decay = (b.prev_BRNM - b.r_BRNCM.select(3, c - 1)).exp_().unsqueeze(-1);
    z_1R1MV = z_1R1MV.defined() ? q.t_BRNMV.add(z_1R1MV * decay) : q.t_BRNMV;
  }
  return param_grads;
}

}  // namespace darkformer::causal_ops
