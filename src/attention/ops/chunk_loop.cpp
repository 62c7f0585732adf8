// The chunk loop (see chunk_loop.h).
#include "attention/ops/chunk_loop.h"

#include <algorithm>
#include <optional>

#include "attention/ops/dtype_probe.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/normaliser_check.h"
#include "attention/ops/state_fold.h"

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

// Closed-form backward of positive features (FeatureMap::positive_features): given phi_NCM (the
// shifted features; the shift is detached, so d log phi = dphi * phi) and dphi_NCM for inputs
// x_NCD, returns dx and adds dW into dw (undefined: W needs no gradient).
torch::Tensor PositiveFeatureBackward(const torch::Tensor& phi_NCM, const torch::Tensor& dphi_NCM,
                                      const torch::Tensor& x_NCD, const torch::Tensor& w_MD, torch::Tensor* dw) {
  const auto dl_NCM = dphi_NCM * phi_NCM;
  auto dx_NCD = torch::matmul(dl_NCM, w_MD);
  dx_NCD.sub_(x_NCD * dl_NCM.sum(-1, /*keepdim=*/true));
  if (dw != nullptr) {
    const int64_t m = dl_NCM.size(-1), d = x_NCD.size(-1);
    const auto g_MD = torch::matmul(dl_NCM.reshape({-1, m}).t(), x_NCD.reshape({-1, d}));
    *dw = dw->defined() ? *dw + g_MD : g_MD;
  }
  return dx_NCD;
}

// A unit's chunk tensors have one key row per KV head (F = 1) and G query heads per row:
// queries 1 x R x G x C x ., keys 1 x R x 1 x C x . The products below fold G into the rows of
// one bmm per chunk (no broadcast copies, no sum over G afterwards).
// [1, R, G, C, X] -> [R, G*C, X]
torch::Tensor QueryRows(const torch::Tensor& t) { return t.reshape({t.size(1), -1, t.size(-1)}); }
// [1, R, 1, C, X] -> [R, C, X]
torch::Tensor KeyRows(const torch::Tensor& t) { return t.reshape({t.size(1), t.size(-2), t.size(-1)}); }
// [R, G*C, X] -> [1, R, G, C, X]
torch::Tensor Grouped(const torch::Tensor& t, const Layout& l) {
  return t.view({1, t.size(0), l.group, t.size(1) / l.group, t.size(2)});
}

// The fused exp2 loops of fast_exp2.h take contiguous fp32 CPU memory and pay off where they run
// vectorised; anything else (CUDA, fp64, a CPU without AVX2) runs the same math as LibTorch ops.
bool FastExp2Applies(const torch::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && Exp2LoopsVectorised();
}

// t = 2^(t - row max) in place over the last dimension; returns the row max (t's shape without
// its last dimension).
torch::Tensor ShiftExp2RowsInPlace(torch::Tensor& t) {
  if (FastExp2Applies(t)) {
    auto max = torch::empty(t.sizes().slice(0, t.dim() - 1), t.options());
    const int64_t cols = t.size(-1);
    ShiftExp2Rows(t.data_ptr<float>(), cols == 0 ? 0 : t.numel() / cols, cols, max.data_ptr<float>());
    return max;
  }
  const auto max = t.amax(-1, /*keepdim=*/true);
  t.sub_(max).exp2_();
  return max.squeeze(-1);
}

// Features of one chunk. Positive features (FeatureMap::positive_features) take a shortcut both
// ways: log phi = x W^T - |x|^2/2 - log(m)/2 is computed in base 2 with W log2(e) (exp2 is the
// faster pass), and the per-row offset |x|^2/2 + log(m)/2 is never subtracted from the L x m
// block: a query's features are shifted by their row max anyway, and a key's offset only enters
// its b_j (a D-wide reduction, done for the unit's whole sequence at once). Other maps go
// through their log_features. Inside a unit, log-scales (b, r and the state references) are in
// base 2: every weight exp(b_j - r_i) is then one exp2 of a difference.
class ChunkFeatures {
 public:
  ChunkFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params, const Layout& l,
                const torch::Tensor& y_1RLD)
      : map_(map), params_(params), l_(l), y_1RLD_(y_1RLD) {
    if (map.positive_features) {
      DF_CHECK(params.size() == 1 && params[0].dim() == 2,
               "FusedCausalLinearAttention: positive_features wants one shared W (m x D), got "
                   << params.size() << " parameter(s)");
      const auto w_MD = params[0].detach().to(y_1RLD.scalar_type());
      w2_DM_ = (w_MD * kLog2E).t().contiguous();
      // (|y|^2 / 2 + log(m) / 2) log2(e) per key (a norm: no L x D temporary).
      offset2_1RL_ = (torch::linalg_vector_norm(y_1RLD, 2, {-1}, false, c10::nullopt).square_() * 0.5 +
                      0.5 * std::log(static_cast<double>(w_MD.size(0)))) *
                     kLog2E;
    }
  }

  // psi = exp(log phi(x) - row max), no autograd: 1 x R x G x C x M (a kernel's own log_features).
  torch::Tensor Queries(const torch::Tensor& x_1HCD) const {
    auto psi = ShiftedQueryFeatures(QueryLogFeatures(map_, params_, x_1HCD, l_));
    RecordDtype(ProbeField::kFeatures, psi);
    return psi;
  }

  // Keys [start, start + c): k_j = exp(log phi(y_j) - b_j) and b_j = max log phi(y_j) / ln 2,
  // no autograd: 1 x R x 1 x C x M and 1 x R x 1 x C (a kernel's own log_features).
  KeyChunk Keys(int64_t start, int64_t c) const {
    auto key = Base2(SplitKeys(KeyLogFeatures(map_, params_, y_1RLD_.narrow(2, start, c), l_)));
    RecordDtype(ProbeField::kFeatures, key.k_BKFCM);
    return key;
  }

  // Both sides of a chunk, no autograd. Positive features: queries and keys stacked in one
  // product x W^T log2(e) (a larger GEMM, and one max / shift / exp2 pass instead of two).
  struct Pair {
    torch::Tensor q_1RGCM;
    KeyChunk key;
  };
  Pair Both(const torch::Tensor& x_1HCD, int64_t start, int64_t c) const {
    if (!map_.positive_features) return {Queries(x_1HCD), Keys(start, c)};
    const int64_t heads = x_1HCD.size(1), rows = l_.kv_heads;
    auto l2_1NCM = torch::matmul(torch::cat({x_1HCD, y_1RLD_.narrow(2, start, c)}, 1), w2_DM_);
    const auto max2_1NC = ShiftExp2RowsInPlace(l2_1NCM);
    RecordDtype(ProbeField::kFeatures, l2_1NCM);
    const int64_t m = l2_1NCM.size(-1);
    const auto b2_1RC = max2_1NC.narrow(1, heads, rows) - offset2_1RL_.narrow(2, start, c);
    return {l2_1NCM.narrow(1, 0, heads).view({1, rows, l_.group, c, m}),
            {l2_1NCM.narrow(1, heads, rows).unsqueeze(2), b2_1RC.unsqueeze(2)}};
  }

  // A key chunk with natural-log b (a kernel's own log_features) in the unit's base 2.
  static KeyChunk Base2(KeyChunk key) {
    key.b_BKFC = key.b_BKFC * kLog2E;
    return key;
  }

 private:
  const FeatureMap& map_;
  const std::vector<torch::Tensor>& params_;
  const Layout& l_;
  torch::Tensor y_1RLD_, w2_DM_, offset2_1RL_;
};

// exp(b_j - r_i) = 2^(b2_j - r2_i) for j <= i inside a chunk, 0 above the diagonal: 1 x R x 1 x
// C x C, with the unit's -inf mask added (exp2 of -inf is 0 and takes the fast path; exp of -inf
// and masked_fill are several times slower at this size). b_j - r_i <= 0 on and below the diagonal.
torch::Tensor CausalWeights(const torch::Tensor& b2_1R1C, const torch::Tensor& r2_1R1C, const torch::Tensor& later_CC) {
  const int64_t c = b2_1R1C.size(-1);
  auto log2_w = b2_1R1C.unsqueeze(-2) - r2_1R1C.unsqueeze(-1);
  return log2_w.add_(later_CC.narrow(0, 0, c).narrow(1, 0, c)).exp2_();
}

// -inf strictly above the diagonal, 0 elsewhere: a full chunk's mask of later keys.
torch::Tensor LaterMask(int64_t chunk_size, const torch::Tensor& like) {
  return torch::full({chunk_size, chunk_size}, -std::numeric_limits<double>::infinity(),
                     like.options().dtype(FeatureDtype(like.scalar_type())))
      .triu(1);
}

// blocks_RGCC (a row's G query heads against its C keys) *= the chunk's causal weights. On the
// fused CPU path later keys become 0 (not 0 times a product that could be non-finite).
void ApplyCausalWeights(std::initializer_list<torch::Tensor> blocks_RGCC, const torch::Tensor& b2_1R1C,
                        const torch::Tensor& r2_1R1C, const torch::Tensor& later_CC, const Layout& l) {
  const bool fast = std::all_of(blocks_RGCC.begin(), blocks_RGCC.end(), FastExp2Applies) &&
                    b2_1R1C.is_cpu() && b2_1R1C.scalar_type() == torch::kFloat32 && b2_1R1C.stride(-1) == 1 &&
                    r2_1R1C.is_cpu() && r2_1R1C.scalar_type() == torch::kFloat32 && r2_1R1C.stride(-1) == 1;
  if (!fast) {
    const auto w_1R1CC = CausalWeights(b2_1R1C, r2_1R1C, later_CC);
    for (const auto& block : blocks_RGCC) Grouped(block, l).mul_(w_1R1CC);
    return;
  }
  std::vector<float*> pointers;
  for (const auto& block : blocks_RGCC) pointers.push_back(block.data_ptr<float>());
  const auto& first = *blocks_RGCC.begin();
  MulCausalWeights(pointers.data(), static_cast<int>(pointers.size()), first.size(0), l.group, b2_1R1C.size(-1),
                   b2_1R1C.data_ptr<float>(), b2_1R1C.stride(1), r2_1R1C.data_ptr<float>(), r2_1R1C.stride(1));
}


}  // namespace

void ForwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                 const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size, torch::Tensor out_1KGLD,
                 torch::Tensor den_1KGL, torch::Tensor r_1K1L) {
  // Nothing here is recorded (the custom function's forward): InferenceMode also skips the
  // version counters and view tracking of the ~200 small ops per chunk.
  c10::InferenceMode inference;
  const ChunkFeatures features(map, p, l, y_1KLD);
  const auto later_CC = LaterMask(chunk_size, x_1HLD);
  KeyState state(/*base2=*/true);
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto [q_1RGCM, key] = features.Both(x_1HLD.narrow(2, start, c), start, c);
    auto r_1R1C = std::get<0>(key.b_BKFC.cummax(-1));
    if (state.ref_X.defined()) r_1R1C = torch::maximum(r_1R1C, state.ref_X.unsqueeze(-1));
    const auto vh_1R1CV = WithOnes(v_1KLD.narrow(2, start, c));
    auto a_RGCC = torch::bmm(QueryRows(q_1RGCM), KeyRows(key.k_BKFCM).transpose(1, 2));
    ApplyCausalWeights({a_RGCC}, key.b_BKFC, r_1R1C, later_CC, l);
    auto n_1RGCV = Grouped(torch::bmm(a_RGCC, KeyRows(vh_1R1CV)), l);
    if (state.s_XMV.defined()) {
      const auto factor_1R1C1 = torch::exp2(state.ref_X.unsqueeze(-1) - r_1R1C).unsqueeze(-1);
      n_1RGCV.addcmul_(Grouped(torch::bmm(QueryRows(q_1RGCM), state.Rows()), l), factor_1R1C1);
    }
    // Rows below the guard take the per-feature form's values (normaliser_check.h).
    const auto den_1RGC = GuardedDivisor(n_1RGCV.select(-1, l.value_dim));
    auto out_chunk = out_1KGLD.narrow(3, start, c);
    torch::div_out(out_chunk, n_1RGCV.narrow(-1, 0, l.value_dim), den_1RGC.unsqueeze(-1));
    den_1KGL.narrow(3, start, c).copy_(den_1RGC);
    r_1K1L.narrow(3, start, c).copy_(r_1R1C);
    if (start + c < l.length) state.Fold(key.k_BKFCM, key.b_BKFC, vh_1R1CV, r_1R1C.select(-1, c - 1));
  }
}

std::vector<torch::Tensor> BackwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& params, const Layout& l,
                                        const UnitSaved& s, int64_t chunk_size, torch::Tensor dx_1HLD,
                                        torch::Tensor dy_1KLD, torch::Tensor dv_1KLD) {
  // dL/dn = [g / den, -(g.out) / den], assembled per chunk (an L x (D+1) tensor would raise the
  // peak) from two per-query scalars computed for the whole unit.
  const auto inv_den_1KGL = s.den_1KGL.reciprocal();
  auto last_1KGL = torch::empty_like(inv_den_1KGL);
  for (int64_t start = 0; start < l.length; start += chunk_size) {  // chunk by chunk: no L x D temporary
    const int64_t c = std::min(chunk_size, l.length - start);
    auto dot_1KGC = last_1KGL.narrow(3, start, c);
    torch::sum_out(dot_1KGC, s.g_1KGLD.narrow(3, start, c) * s.out_1KGLD.narrow(3, start, c), {-1});
    dot_1KGC.mul_(inv_den_1KGL.narrow(3, start, c)).neg_();
  }
  auto grad_n = [&](int64_t start, int64_t c) {
    return torch::cat({s.g_1KGLD.narrow(3, start, c) * inv_den_1KGL.narrow(3, start, c).unsqueeze(-1),
                       last_1KGL.narrow(3, start, c).unsqueeze(-1)},
                      -1);
  };
  std::vector<torch::Tensor> param_grads(params.size());
  // Closed-form feature gradients (FeatureMap::positive_features): W and where its gradient goes.
  const bool closed = map.positive_features;
  // With closed-form feature gradients nothing here is recorded: InferenceMode (as in the forward).
  std::optional<c10::InferenceMode> inference;
  if (closed) inference.emplace();
  const ChunkFeatures features(map, params, l, s.y_1KLD);
  const auto later_CC = LaterMask(chunk_size, s.x_1HLD);
  torch::Tensor w_MD;
  torch::Tensor* dw = nullptr;
  if (closed) {
    w_MD = params[0].detach().to(s.x_1HLD.scalar_type());
    if (params[0].requires_grad()) dw = &param_grads[0];
  }
  std::vector<int64_t> starts;
  for (int64_t start = 0; start < l.length; start += chunk_size) starts.push_back(start);
  auto chunk_len = [&](int64_t start) { return std::min(chunk_size, l.length - start); };

  // Scan 1, forward order: query gradients against the running key state.
  {
    KeyState state(/*base2=*/true);
    for (const int64_t start : starts) {
      const int64_t c = chunk_len(start);
      const auto leaves = closed ? params : ParamLeaves(params);
      const auto x_leaf = s.x_1HLD.narrow(2, start, c).detach().requires_grad_(!closed);
      torch::Tensor q_1RGCM;
      KeyChunk key;
      if (closed) {
        auto pair = features.Both(x_leaf, start, c);
        q_1RGCM = pair.q_1RGCM;
        key = pair.key;
      } else {
        torch::AutoGradMode grad_on(true);
        q_1RGCM = ShiftedQueryFeatures(QueryLogFeatures(map, leaves, x_leaf, l));
      }
      torch::NoGradGuard no_grad;
      if (!closed) key = features.Keys(start, c);
      const auto r_1R1C = s.r_1K1L.narrow(-1, start, c);
      const auto vh_1R1CV = WithOnes(s.v_1KLD.narrow(2, start, c));
      const auto gh_1RGCV = grad_n(start, c);
      auto p_RGCC = torch::bmm(QueryRows(gh_1RGCV), KeyRows(vh_1R1CV).transpose(1, 2));
      ApplyCausalWeights({p_RGCC}, key.b_BKFC, r_1R1C, later_CC, l);
      auto dq_RGCM = torch::bmm(p_RGCC, KeyRows(key.k_BKFCM));
      if (state.s_XMV.defined()) {
        const auto factor_1R1C1 = torch::exp2(state.ref_X.unsqueeze(-1) - r_1R1C).unsqueeze(-1);
        dq_RGCM.baddbmm_(QueryRows(gh_1RGCV * factor_1R1C1), state.Rows().transpose(1, 2));
      }
      const auto dq_1RGCM = Grouped(dq_RGCM, l);
      if (closed) {
        const auto x_NCD = x_leaf.reshape({-1, c, x_leaf.size(-1)});
        const auto m = q_1RGCM.size(-1);
        dx_1HLD.narrow(2, start, c).copy_(
            PositiveFeatureBackward(q_1RGCM.reshape({-1, c, m}), dq_1RGCM.reshape({-1, c, m}), x_NCD, w_MD, dw)
                .view_as(x_leaf));
      } else {
        torch::AutoGradMode grad_on(true);
        dx_1HLD.narrow(2, start, c).copy_(BackpropChunk(q_1RGCM, dq_1RGCM, x_leaf, leaves, param_grads));
      }
      if (start + c < l.length) state.Fold(key.k_BKFCM, key.b_BKFC, vh_1R1CV, r_1R1C.select(-1, c - 1));
    }
  }

  // Scan 2, reverse order: key and value gradients against the running query state
  // R = sum_{i in later chunks} exp(ref - r_i) psi_i gh_i^T, ref = this chunk's last prefix max.
  torch::Tensor r_state_RMV;
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    const int64_t start = *it, c = chunk_len(start);
    const auto leaves = closed ? params : ParamLeaves(params);
    const auto y_leaf = s.y_1KLD.narrow(2, start, c).detach().requires_grad_(!closed);
    KeyChunk key;
    torch::Tensor q_1RGCM;
    if (closed) {
      auto pair = features.Both(s.x_1HLD.narrow(2, start, c), start, c);
      q_1RGCM = pair.q_1RGCM;
      key = pair.key;
    } else {
      torch::AutoGradMode grad_on(true);
      key = ChunkFeatures::Base2(SplitKeys(KeyLogFeatures(map, leaves, y_leaf, l)));
    }
    torch::NoGradGuard no_grad;
    if (!closed) q_1RGCM = features.Queries(s.x_1HLD.narrow(2, start, c));
    const auto k_RCM = KeyRows(key.k_BKFCM.detach());
    const auto q_RGCM = QueryRows(q_1RGCM);
    const auto r_1R1C = s.r_1K1L.narrow(-1, start, c);
    const auto vh_1R1CV = WithOnes(s.v_1KLD.narrow(2, start, c));
    const auto gh_RGCV = QueryRows(grad_n(start, c));
    auto a_RGCC = torch::bmm(q_RGCM, k_RCM.transpose(1, 2));
    auto p_RGCC = torch::bmm(gh_RGCV, KeyRows(vh_1R1CV).transpose(1, 2));
    ApplyCausalWeights({a_RGCC, p_RGCC}, key.b_BKFC, r_1R1C, later_CC, l);
    // Sums over the G query heads of a row are the contraction over G*C rows.
    auto dk_RCM = torch::bmm(p_RGCC.transpose(1, 2), q_RGCM);
    auto dvh_RCV = torch::bmm(a_RGCC.transpose(1, 2), gh_RGCV);
    const auto ref_1R1 = r_1R1C.select(-1, c - 1);
    if (r_state_RMV.defined()) {
      const auto factor_RC1 = KeyRows(torch::exp2(key.b_BKFC - ref_1R1.unsqueeze(-1)).unsqueeze(-1));
      dk_RCM.baddbmm_(KeyRows(vh_1R1CV) * factor_RC1, r_state_RMV.transpose(1, 2));
      dvh_RCV.addcmul_(torch::bmm(k_RCM, r_state_RMV), factor_RC1);
    }
    if (closed) {
      dy_1KLD.narrow(2, start, c).copy_(
          PositiveFeatureBackward(k_RCM, dk_RCM, y_leaf.reshape({-1, c, y_leaf.size(-1)}), w_MD, dw).view_as(y_leaf));
    } else {
      torch::AutoGradMode grad_on(true);
      dy_1KLD.narrow(2, start, c).copy_(
          BackpropChunk(key.k_BKFCM, dk_RCM.view_as(key.k_BKFCM), y_leaf, leaves, param_grads));
    }
    dv_1KLD.narrow(2, start, c).copy_(dvh_RCV.narrow(-1, 0, l.value_dim).unsqueeze(0));
    if (start == 0) break;
    // Bring R to the previous chunk's reference (<= every r_i from here on: factors <= 1); the
    // query weights go on gh (C x V) rather than on psi (C x M).
    const auto prev_ref_1R1 = s.r_1K1L.select(-1, start - 1);
    const auto w_1R1C1 = torch::exp2(prev_ref_1R1.unsqueeze(-1) - r_1R1C).unsqueeze(-1);
    const auto ghw_RGCV = QueryRows(Grouped(gh_RGCV, l) * w_1R1C1);
    if (r_state_RMV.defined()) {
      r_state_RMV.mul_(torch::exp2(prev_ref_1R1 - ref_1R1).view({-1, 1, 1})).baddbmm_(q_RGCM.transpose(1, 2), ghw_RGCV);
    } else {
      r_state_RMV = torch::bmm(q_RGCM.transpose(1, 2), ghw_RGCV);
    }
  }
  return param_grads;
}

}  // namespace darkformer::causal_ops
