// Fused causal linear attention (see fused_causal_attention.h). The math per chunk, with
// psi_i = exp(log phi(x_i) - c_i) (query, shifted by its row max c_i), k_j = exp(log phi(y_j) - b_j)
// and r_i = max_{j <= i} b_j:
//   n_i = sum_{j <= i} (psi_i.k_j) exp(b_j - r_i) [v_j, 1]    out_i = n_i[:D] / n_i[D]
// Backward, with g_i = dL/dout_i and gh_i = [g_i / n_i[D], -(g_i.out_i) / n_i[D]] = dL/dn_i:
//   dL/dpsi_i = sum_{j <= i} exp(b_j - r_i) (gh_i.[v_j,1]) k_j     (forward scan: state S)
//   dL/dk_j   = sum_{i >= j} exp(b_j - r_i) (gh_i.[v_j,1]) psi_i   (reverse scan: state R)
//   dL/d[v_j,1] = sum_{i >= j} (psi_i.k_j) exp(b_j - r_i) gh_i
// and the features' own backward (through the kernel's log phi) is recomputed per chunk.
#include "attention/fused_causal_attention.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <limits>

#include "attention/fast_exp2.h"
#include "attention/fused_causal_cpu.h"
#include "attention/ops/chunk_parallel.h"
#include "attention/positive_features.h"
#include "util/error.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace {

using torch::indexing::Slice;

constexpr double kLog2E = 1.4426950408889634;  // log2(e)

struct Layout {
  int64_t batch, heads, kv_heads, group, key_heads, length, value_dim;
};

Layout MakeLayout(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                  const FeatureMap& map) {
  DF_CHECK(x_BHLD.dim() == 4 && y_BKLD.dim() == 4 && v_BKLD.dim() == 4,
           "FusedCausalLinearAttention: x, y, v must be 4-D, got " << x_BHLD.sizes() << ", " << y_BKLD.sizes()
                                                                   << ", " << v_BKLD.sizes());
  Layout l{x_BHLD.size(0), x_BHLD.size(1), y_BKLD.size(1), 1, 1, x_BHLD.size(2), v_BKLD.size(3)};
  DF_CHECK(l.heads % l.kv_heads == 0, "FusedCausalLinearAttention: " << l.heads << " query heads are not a multiple of "
                                                                     << l.kv_heads << " KV heads");
  DF_CHECK(y_BKLD.size(0) == l.batch && v_BKLD.size(0) == l.batch && v_BKLD.size(1) == l.kv_heads &&
               y_BKLD.size(2) == l.length && v_BKLD.size(2) == l.length && y_BKLD.size(3) == x_BHLD.size(3),
           "FusedCausalLinearAttention: shapes do not match: x " << x_BHLD.sizes() << ", y " << y_BKLD.sizes()
                                                                 << ", v " << v_BKLD.sizes());
  l.group = l.heads / l.kv_heads;
  l.key_heads = map.keys_per_query_head ? l.group : 1;
  return l;
}

// log phi of a query block x_BHCD, laid out per KV head: BKGCM.
torch::Tensor QueryLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                               const torch::Tensor& x_BHCD, const Layout& l) {
  const auto lq_BHCM = map.log_features(x_BHCD, params, /*is_query=*/true);
  return lq_BHCM.view({l.batch, l.kv_heads, l.group, x_BHCD.size(2), lq_BHCM.size(-1)});
}

// log phi of a key block y_BKCD: BKFCM, computed once per KV head unless the map's parameters
// are per query head.
torch::Tensor KeyLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                             const torch::Tensor& y_BKCD, const Layout& l) {
  if (l.key_heads == 1) return map.log_features(y_BKCD, params, /*is_query=*/false).unsqueeze(2);
  const int64_t c = y_BKCD.size(2), d = y_BKCD.size(3);
  const auto y_BHCD = y_BKCD.unsqueeze(2).expand({l.batch, l.kv_heads, l.group, c, d}).reshape({l.batch, l.heads, c, d});
  const auto lk_BHCM = map.log_features(y_BHCD, params, /*is_query=*/false);
  return lk_BHCM.view({l.batch, l.kv_heads, l.group, c, lk_BHCM.size(-1)});
}

// Outside autograd the shift and exp run in place (one L x m block instead of three).
torch::Tensor ShiftedQueryFeatures(torch::Tensor lq_BKGCM) {
  const auto shift = lq_BKGCM.amax(-1, /*keepdim=*/true).detach();
  if (!lq_BKGCM.requires_grad()) return lq_BKGCM.sub_(shift).exp_();
  return torch::exp(lq_BKGCM - shift);
}

// [v, 1] per KV head, broadcastable over the group: BK1CV.
torch::Tensor WithOnes(const torch::Tensor& v_BKCD) {
  return torch::cat({v_BKCD, torch::ones_like(v_BKCD.narrow(-1, 0, 1))}, -1).unsqueeze(2);
}

torch::Tensor Tiny(const torch::Tensor& t) {
  return torch::scalar_tensor(t.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::min()
                                                                 : std::numeric_limits<float>::min(),
                              t.options());
}

// Key-side quantities of one chunk: k_j = exp(lk_j - b_j) and b_j = max log phi(y_j).
struct KeyChunk {
  torch::Tensor k_BKFCM, b_BKFC;
};
KeyChunk SplitKeys(torch::Tensor lk_BKFCM) {
  const auto b_BKFC = lk_BKFCM.amax(-1).detach();
  if (!lk_BKFCM.requires_grad()) return {lk_BKFCM.sub_(b_BKFC.unsqueeze(-1)).exp_(), b_BKFC};
  return {torch::exp(lk_BKFCM - b_BKFC.unsqueeze(-1)), b_BKFC};
}

// The running key state: S = sum_j exp(b_j - ref) k_j [v_j, 1]^T over the keys folded so far.
struct KeyState {
  torch::Tensor s_BKFMV, ref_BKF;
  // Folds a chunk whose prefix-max reference at its last key is new_ref (>= ref): every factor <= 1.
  void Fold(const torch::Tensor& k_BKFCM, const torch::Tensor& b_BKFC, const torch::Tensor& vh_BK1CV,
            const torch::Tensor& new_ref_BKF) {
    const auto kw_BKFCM = k_BKFCM * torch::exp(b_BKFC - new_ref_BKF.unsqueeze(-1)).unsqueeze(-1);
    const auto chunk_BKFMV = torch::matmul(kw_BKFCM.transpose(-1, -2), vh_BK1CV);
    s_BKFMV = s_BKFMV.defined()
                  ? s_BKFMV * torch::exp(ref_BKF - new_ref_BKF).unsqueeze(-1).unsqueeze(-1) + chunk_BKFMV
                  : chunk_BKFMV;
    ref_BKF = new_ref_BKF;
  }
};

// The feature map travels with the autograd node (the caller's copy is gone by the backward).
struct FeatureMapCapsule : torch::CustomClassHolder {
  explicit FeatureMapCapsule(FeatureMap m) : map(std::move(m)) {}
  FeatureMap map;
};

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

// Units of work. The batch is folded into the heads (FoldBatch below), so a key row is a KV head
// of one sequence whose key features the group shares, or a query head when key features are per
// query head (then y and v are repeated per query head and each row's group is that one head).
// Rows are independent: a unit is a block of rows scanned by one thread, each op of it covering
// all its rows at once (per-op overhead dominates at chunk scale). On the CPU there are at least
// as many blocks as intra-op threads, and at most kMaxUnitHeads query heads per block: a chunk's
// query features (8 x 64 x 256 floats = 512 KiB at C = 64, m = 256) then stay in a core's L2.
// With fewer rows than threads (multi-query, one sequence) a row's query heads are split into
// parts too; each part recomputes the row's key side and adds its share of dk, dv (a part's own
// buffer). On other devices one unit covers every row: each op is one launch for the whole batch.
constexpr int64_t kMaxUnitHeads = 8;

struct Unit {
  int64_t row0, rows, part, g0, gn;  // rows [row0, row0 + rows), query heads [g0, g0 + gn) of each
};

struct Units {
  int64_t rows, group, blocks, block_rows, parts, part_group;  // query heads per row
  int64_t count() const { return blocks * parts; }
  Unit operator()(int64_t i) const {
    const int64_t block = i / parts, part = i % parts;
    const int64_t row0 = block * block_rows, g0 = part * part_group;
    return {row0, std::min(block_rows, rows - row0), part, g0, std::min(part_group, group - g0)};
  }
  Layout layout(const Layout& l, const Unit& u) const {
    return {1, u.rows * u.gn, u.rows, u.gn, 1, l.length, l.value_dim};
  }
  // The unit's query heads are contiguous: a part covers one row (parts > 1 only with one row per block).
  int64_t head0(const Unit& u) const { return u.row0 * group + u.g0; }
  int64_t heads(const Unit& u) const { return u.rows * u.gn; }
};

Units MakeUnits(const Layout& l, const c10::Device& device) {
  const int64_t rows = l.key_heads == 1 ? l.kv_heads : l.heads, group = l.key_heads == 1 ? l.group : 1;
  if (!device.is_cpu()) return {rows, group, 1, rows, 1, group};
  const int64_t threads = at::get_num_threads();
  const int64_t by_size = (rows * group + kMaxUnitHeads - 1) / kMaxUnitHeads;
  const int64_t blocks = std::clamp<int64_t>(std::max(threads, by_size), 1, rows);
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  int64_t parts = 1;
  if (block_rows == 1 && rows < threads) parts = std::min(group, (threads + rows - 1) / rows);
  const int64_t part_group = (group + parts - 1) / parts;
  return {rows, group, (rows + block_rows - 1) / block_rows, block_rows, (group + part_group - 1) / part_group, part_group};
}

// Keys and values per row: as given, or repeated per query head.
torch::Tensor PerRow(const torch::Tensor& t_BKLD, const Layout& l) {
  return l.key_heads == 1 ? t_BKLD : t_BKLD.repeat_interleave(l.group, 1);
}

// The unit's slice of a 1N... tensor: heads [h, h + n).
torch::Tensor Take(const torch::Tensor& t, int64_t h, int64_t n) { return t.narrow(1, h, n); }
// The unit's query-side slice of a 1N... tensor, laid out per row: 1 x rows x group x ...
torch::Tensor TakeGrouped(const torch::Tensor& t, const Units& units, const Unit& u) {
  auto sizes = t.sizes().vec();
  sizes.erase(sizes.begin(), sizes.begin() + 2);
  sizes.insert(sizes.begin(), {1, u.rows, u.gn});
  return Take(t, units.head0(u), units.heads(u)).view(sizes);
}

bool PerHead(const FeatureMap& map, size_t i) { return i < map.params_per_head.size() && map.params_per_head[i]; }

// The unit's parameters: per-head ones narrowed to its query heads.
std::vector<torch::Tensor> UnitParams(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                                      const Units& units, const Unit& u) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back(PerHead(map, i) ? params[i].narrow(0, units.head0(u), units.heads(u)) : params[i]);
  }
  return out;
}

// Runs fn(unit) for every unit on LibTorch's intra-op threads, each unit single-threaded inside
// (a chunk's ops are too small for two threads to share). Grad mode and the rest of the caller's
// thread-local state travel with the work.
template <typename Fn>
void ForEachUnit(int64_t count, const Fn& fn) {
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller_state);
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
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

// The running key state S = sum_j exp(b_j - ref) k_j [v_j, 1]^T per key row (R x M x V); b and
// ref in base 2.
struct RowState {
  torch::Tensor s_RMV, ref_1R1;
  // Folds a chunk whose prefix-max reference at its last key is new_ref (>= ref): every factor
  // <= 1; the key weights go on [v, 1] (C x V) rather than on k (C x M).
  void Fold(const KeyChunk& key, const torch::Tensor& vh_1R1CV, const torch::Tensor& new_ref_1R1) {
    const auto vw_RCV = KeyRows(vh_1R1CV * torch::exp2(key.b_BKFC - new_ref_1R1.unsqueeze(-1)).unsqueeze(-1));
    const auto k_RMC = KeyRows(key.k_BKFCM).transpose(1, 2);
    if (s_RMV.defined()) {
      s_RMV.mul_(torch::exp2(ref_1R1 - new_ref_1R1).view({-1, 1, 1})).baddbmm_(k_RMC, vw_RCV);
    } else {
      s_RMV = torch::bmm(k_RMC, vw_RCV);
    }
    RecordDtype(ProbeField::kState, s_RMV);
    ref_1R1 = new_ref_1R1;
  }
};

// The raw CPU kernel (fused_causal_cpu.h) takes positive features in fp32 on a CPU whose exp2
// loops run vectorised; the operator makes x, y, v contiguous for it (every per-head block then L
// contiguous rows, as in every tensor the operator allocates). `op: auto` runs it where it
// applies; `op: raw_cpu` insists on it; the other forms run LibTorch ops on the same inputs.

bool CpuKernelApplies(const FeatureMap& map, const torch::Tensor& x) {
  const bool applies = map.positive_features && x.is_cpu() && x.scalar_type() == torch::kFloat32 && Exp2LoopsVectorised();
  DF_CHECK(map.op != CausalOp::kRawCpu || applies,
           "op: raw_cpu runs positive features in fp32 on a CPU with AVX2 only; got "
               << (map.positive_features ? "positive" : "another kernel's") << " features, " << x.scalar_type() << " on "
               << x.device() << (Exp2LoopsVectorised() ? "" : " without AVX2"));
  if (map.op == CausalOp::kRawCpu) return true;
  return applies && map.op == CausalOp::kAuto;
}

// Every per-head block of a 1 x N x ... x L x W tensor is L contiguous rows (N's stride is free).
bool RowsContiguous(const torch::Tensor& t) {
  return t.stride(-1) == 1 && (t.dim() < 2 || t.size(-2) <= 1 || t.stride(-2) == t.size(-1));
}

bool AllRowsContiguous(std::initializer_list<torch::Tensor> tensors) {
  return std::all_of(tensors.begin(), tensors.end(), RowsContiguous);
}

// The kernel's chunk: at most L (its buffers are sized by it).
int64_t KernelChunk(int64_t chunk_size, int64_t length) { return std::max<int64_t>(1, std::min(chunk_size, length)); }

// The kernel's view of one key row of a unit (heads of the unit laid out as ForwardUnit's).
struct CpuRows {
  torch::Tensor w_MD, w2_DM;
  explicit CpuRows(const std::vector<torch::Tensor>& params) {
    w_MD = params.at(0).detach().to(torch::kFloat32).contiguous();
    w2_DM = (w_MD * kLog2E).t().contiguous();
  }
  PositiveRow Row(const Layout& l, const torch::Tensor& x_1HLD, const torch::Tensor& y_1KLD,
                  const torch::Tensor& v_1KLD, int64_t chunk_size, int64_t row) const {
    return {l.length,
            x_1HLD.size(3),
            l.value_dim,
            w_MD.size(0),
            l.group,
            KernelChunk(chunk_size, l.length),
            w_MD.data_ptr<float>(),
            w2_DM.data_ptr<float>(),
            x_1HLD.data_ptr<float>() + row * l.group * x_1HLD.stride(1),
            x_1HLD.stride(1),
            y_1KLD.data_ptr<float>() + row * y_1KLD.stride(1),
            v_1KLD.data_ptr<float>() + row * v_1KLD.stride(1)};
  }
};

// ForwardUnit and BackwardUnit through the raw kernel, one key row at a time; the forward also
// writes each row's checkpoints of the key state (states_1RS, refs_1RN), which the backward reads.
void ForwardUnitRaw(const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                    const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size,
                    const torch::Tensor& out_1KGLD, const torch::Tensor& den_1KGL, const torch::Tensor& r_1K1L,
                    const torch::Tensor& states_1RS, const torch::Tensor& refs_1RN) {
  DF_CHECK(AllRowsContiguous({x_1HLD, y_1KLD, v_1KLD, out_1KGLD, den_1KGL, r_1K1L, states_1RS, refs_1RN}),
           "FusedCausalLinearAttention: the CPU kernel got a block of non-contiguous rows");
  const CpuRows rows(p);
  for (int64_t row = 0; row < l.kv_heads; ++row) {
    RunPositiveRowForward(rows.Row(l, x_1HLD, y_1KLD, v_1KLD, chunk_size, row),
                          {out_1KGLD.data_ptr<float>() + row * out_1KGLD.stride(1), out_1KGLD.stride(2),
                           den_1KGL.data_ptr<float>() + row * den_1KGL.stride(1), den_1KGL.stride(2),
                           r_1K1L.data_ptr<float>() + row * r_1K1L.stride(1),
                           states_1RS.data_ptr<float>() + row * states_1RS.stride(1),
                           refs_1RN.data_ptr<float>() + row * refs_1RN.stride(1)});
  }
}

// Forward scan of one unit: writes out_1KGLD, den_1KGL and r_1K1L (views into the outputs; r in
// base 2).
void ForwardUnit(const FeatureMap& map, const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                 const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size, torch::Tensor out_1KGLD,
                 torch::Tensor den_1KGL, torch::Tensor r_1K1L) {
  // Nothing here is recorded (the custom function's forward): InferenceMode also skips the
  // version counters and view tracking of the ~200 small ops per chunk.
  c10::InferenceMode inference;
  const ChunkFeatures features(map, p, l, y_1KLD);
  const auto later_CC = LaterMask(chunk_size, x_1HLD);
  RowState state;
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto [q_1RGCM, key] = features.Both(x_1HLD.narrow(2, start, c), start, c);
    auto r_1R1C = std::get<0>(key.b_BKFC.cummax(-1));
    if (state.ref_1R1.defined()) r_1R1C = torch::maximum(r_1R1C, state.ref_1R1.unsqueeze(-1));
    const auto vh_1R1CV = WithOnes(v_1KLD.narrow(2, start, c));
    auto a_RGCC = torch::bmm(QueryRows(q_1RGCM), KeyRows(key.k_BKFCM).transpose(1, 2));
    ApplyCausalWeights({a_RGCC}, key.b_BKFC, r_1R1C, later_CC, l);
    auto n_1RGCV = Grouped(torch::bmm(a_RGCC, KeyRows(vh_1R1CV)), l);
    if (state.s_RMV.defined()) {
      const auto factor_1R1C1 = torch::exp2(state.ref_1R1.unsqueeze(-1) - r_1R1C).unsqueeze(-1);
      n_1RGCV.addcmul_(Grouped(torch::bmm(QueryRows(q_1RGCM), state.s_RMV), l), factor_1R1C1);
    }
    const auto den_1RGC = n_1RGCV.select(-1, l.value_dim).clamp_min(Tiny(n_1RGCV));
    auto out_chunk = out_1KGLD.narrow(3, start, c);
    torch::div_out(out_chunk, n_1RGCV.narrow(-1, 0, l.value_dim), den_1RGC.unsqueeze(-1));
    den_1KGL.narrow(3, start, c).copy_(den_1RGC);
    r_1K1L.narrow(3, start, c).copy_(r_1R1C);
    if (start + c < l.length) state.Fold(key, vh_1R1CV, r_1R1C.select(-1, c - 1));
  }
}

// What the backward of one unit reads (views of the saved tensors and of the incoming gradient).
struct UnitSaved {
  torch::Tensor x_1HLD, y_1KLD, v_1KLD, out_1KGLD, den_1KGL, r_1K1L, g_1KGLD;
};

// Backward of one unit: writes dx_1HLD, dy_1KLD, dv_1KLD and returns the gradients of its
// parameters (the unit's slices of per-head ones).
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
    RowState state;
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
      if (state.s_RMV.defined()) {
        const auto factor_1R1C1 = torch::exp2(state.ref_1R1.unsqueeze(-1) - r_1R1C).unsqueeze(-1);
        dq_RGCM.baddbmm_(QueryRows(gh_1RGCV * factor_1R1C1), state.s_RMV.transpose(1, 2));
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
      if (start + c < l.length) state.Fold(key, vh_1R1CV, r_1R1C.select(-1, c - 1));
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

std::vector<torch::Tensor> BackwardUnitRaw(const std::vector<torch::Tensor>& params, const Layout& l,
                                           const UnitSaved& s, const torch::Tensor& states_1RS,
                                           const torch::Tensor& refs_1RN, int64_t chunk_size,
                                           const torch::Tensor& dx_1HLD, const torch::Tensor& dy_1KLD,
                                           const torch::Tensor& dv_1KLD) {
  DF_CHECK(AllRowsContiguous({s.x_1HLD, s.y_1KLD, s.v_1KLD, s.out_1KGLD, s.den_1KGL, s.r_1K1L, s.g_1KGLD, dx_1HLD,
                              dy_1KLD, dv_1KLD, states_1RS, refs_1RN}),
           "FusedCausalLinearAttention: the CPU kernel's backward got a block of non-contiguous rows");
  c10::InferenceMode inference;
  const CpuRows rows(params);
  torch::Tensor dw_MD;
  if (params[0].requires_grad()) dw_MD = torch::zeros_like(rows.w_MD);
  for (int64_t row = 0; row < l.kv_heads; ++row) {
    auto at = [row](const torch::Tensor& t) { return t.data_ptr<float>() + row * t.stride(1); };
    RunPositiveRowBackward(rows.Row(l, s.x_1HLD, s.y_1KLD, s.v_1KLD, chunk_size, row),
                           {at(states_1RS), at(refs_1RN), at(s.out_1KGLD), s.out_1KGLD.stride(2), at(s.den_1KGL),
                            s.den_1KGL.stride(2), at(s.r_1K1L), at(s.g_1KGLD), s.g_1KGLD.stride(2),
                            dx_1HLD.data_ptr<float>() + row * l.group * dx_1HLD.stride(1), dx_1HLD.stride(1),
                            at(dy_1KLD), at(dv_1KLD), dw_MD.defined() ? dw_MD.data_ptr<float>() : nullptr});
  }
  std::vector<torch::Tensor> param_grads(params.size());
  param_grads[0] = dw_MD.defined() ? dw_MD.to(params[0].scalar_type()) : dw_MD;
  return param_grads;
}

// The batch folds into the heads (B x N x L x D -> 1 x BN x L x D, a view when the layout allows):
// the units then split all B K key rows among the threads, and each op of a unit covers several
// sequences instead of one unit per sequence (fewer, larger ops on the CPU; fewer launches on a GPU).
torch::Tensor FoldBatch(const torch::Tensor& t_BNLD) {
  return t_BNLD.reshape({1, t_BNLD.size(0) * t_BNLD.size(1), t_BNLD.size(2), t_BNLD.size(3)});
}
torch::Tensor UnfoldBatch(const torch::Tensor& t_1NLD, int64_t batch) {
  return t_1NLD.view({batch, t_1NLD.size(1) / batch, t_1NLD.size(2), t_1NLD.size(3)});
}
// Per-head parameters repeated per sequence to match the folded heads (b, h) -> b H + h.
std::vector<torch::Tensor> FoldParams(const FeatureMap& map, const std::vector<torch::Tensor>& params, int64_t batch) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!PerHead(map, i) || batch == 1) {
      out.push_back(params[i]);
      continue;
    }
    std::vector<int64_t> times(params[i].dim(), 1);
    times[0] = batch;
    // A leaf that keeps the flag: the backward differentiates w.r.t. its slices (ParamLeaves).
    out.push_back(params[i].detach().repeat(times).requires_grad_(params[i].requires_grad()));
  }
  return out;
}

class FusedCausalFunction : public torch::autograd::Function<FusedCausalFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_BHLD,
                               const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD, at::TensorList params,
                               const FeatureMap& feature_map, int64_t chunk_size) {
    MakeLayout(x_BHLD, y_BKLD, v_BKLD, feature_map);  // checks the unfolded shapes
    const int64_t batch = x_BHLD.size(0);
    // The CPU kernel reads per-head blocks of contiguous rows (a no-op for the usual layouts).
    const bool raw = CpuKernelApplies(feature_map, x_BHLD);
    const auto x_1NLD = FoldBatch(raw ? x_BHLD.contiguous() : x_BHLD);
    const auto y_1NLD = FoldBatch(raw ? y_BKLD.contiguous() : y_BKLD);
    const auto v_1NLD = FoldBatch(raw ? v_BKLD.contiguous() : v_BKLD);
    const std::vector<torch::Tensor> original(params.begin(), params.end());
    const auto p = FoldParams(feature_map, original, batch);
    const auto l = MakeLayout(x_1NLD, y_1NLD, v_1NLD, feature_map);
    const auto units = MakeUnits(l, x_1NLD.device());
    // Outputs go straight into preallocated tensors, each unit writing its own slices.
    const auto options = x_BHLD.options().dtype(FeatureDtype(x_BHLD.scalar_type()));
    auto out_BHLD = torch::empty({batch, x_BHLD.size(1), l.length, l.value_dim}, options);
    const auto out_1NLD = FoldBatch(out_BHLD);
    auto den_1NL = torch::empty({1, l.heads, l.length}, options);
    // r per row; parts of a row compute the same r, parts after the first into a scratch copy.
    auto r_P1RL = torch::empty({units.parts, 1, units.rows, l.length}, options);
    const auto y_1RLD = PerRow(y_1NLD, l), v_1RLD = PerRow(v_1NLD, l);
    // The raw kernel's checkpoints of the key state per row (fused_causal_cpu.h); parts of a row
    // after the first write theirs into scratch copies, dropped after the forward.
    torch::Tensor states_1RS, refs_1RN, extra_states_P1RS, extra_refs_P1RN;
    if (raw) {
      const int64_t m = p.at(0).size(0), count = CheckpointCount(l.length, m, KernelChunk(chunk_size, l.length));
      states_1RS = torch::empty({1, units.rows, count * m * (l.value_dim + 1)}, options);
      refs_1RN = torch::empty({1, units.rows, count}, options);
      if (units.parts > 1) {
        extra_states_P1RS = torch::empty({units.parts - 1, 1, units.rows, states_1RS.size(2)}, options);
        extra_refs_P1RN = torch::empty({units.parts - 1, 1, units.rows, count}, options);
      }
    }
    ForEachUnit(units.count(), [&](int64_t i) {
      const auto u = units(i);
      const auto unit_params = UnitParams(feature_map, p, units, u);
      const auto x = Take(x_1NLD, units.head0(u), units.heads(u)), y = Take(y_1RLD, u.row0, u.rows),
                 v = Take(v_1RLD, u.row0, u.rows), out = TakeGrouped(out_1NLD, units, u),
                 den = TakeGrouped(den_1NL, units, u), r = Take(r_P1RL[u.part], u.row0, u.rows).unsqueeze(2);
      if (raw) {
        const auto& states = u.part == 0 ? states_1RS : extra_states_P1RS[u.part - 1];
        const auto& refs = u.part == 0 ? refs_1RN : extra_refs_P1RN[u.part - 1];
        ForwardUnitRaw(unit_params, units.layout(l, u), x, y, v, chunk_size, out, den, r,
                       Take(states, u.row0, u.rows), Take(refs, u.row0, u.rows));
      } else {
        ForwardUnit(feature_map, unit_params, units.layout(l, u), x, y, v, chunk_size, out, den, r);
      }
    });
    const auto r_1RL = r_P1RL[0];
    RecordDtype(ProbeField::kInputs, x_1NLD);
    RecordDtype(ProbeField::kNormaliser, den_1NL);
    if (raw) {  // the raw kernel computes features and state in fp32 (float buffers) by construction
      RecordDtype(ProbeField::kFeatures, states_1RS);
      RecordDtype(ProbeField::kState, states_1RS);
    }
    std::vector<torch::Tensor> saved = {x_1NLD,
                                        y_1NLD,
                                        v_1NLD,
                                        out_BHLD,
                                        den_1NL,
                                        r_1RL,
                                        states_1RS,
                                        refs_1RN};
    saved.insert(saved.end(), original.begin(), original.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["map"] = c10::IValue::make_capsule(c10::make_intrusive<FeatureMapCapsule>(feature_map));
    ctx->saved_data["chunk"] = chunk_size;
    ctx->saved_data["batch"] = batch;
    return out_BHLD;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // A backward called inside an autocast scope must not turn the scans' products bf16.
    NoAutocastGuard no_autocast;
    const auto saved = ctx->get_saved_variables();
    const auto &x_1NLD = saved[0], &y_1NLD = saved[1], &v_1NLD = saved[2];
    const auto &den_1NL = saved[4], &r_1RL = saved[5], &states_1RS = saved[6], &refs_1RN = saved[7];
    const auto out_1NLD = FoldBatch(saved[3]);
    const std::vector<torch::Tensor> original(saved.begin() + 8, saved.end());
    const auto capsule = c10::static_intrusive_pointer_cast<FeatureMapCapsule>(ctx->saved_data["map"].toCapsule());
    const FeatureMap& map = capsule->map;
    const int64_t chunk_size = ctx->saved_data["chunk"].toInt(), batch = ctx->saved_data["batch"].toInt();
    const auto params = FoldParams(map, original, batch);
    const auto l = MakeLayout(x_1NLD, y_1NLD, v_1NLD, map);
    const auto units = MakeUnits(l, x_1NLD.device());
    const auto g_1NLD = FoldBatch(grad_outputs[0].to(out_1NLD.scalar_type()).contiguous());
    const auto y_1RLD = PerRow(y_1NLD, l), v_1RLD = PerRow(v_1NLD, l);

    auto dx_1NLD = torch::empty_like(x_1NLD);
    // dy, dv per part of a row's query heads (summed below when a row is split).
    auto dy_P1RLD = torch::empty({units.parts, 1, units.rows, l.length, y_1RLD.size(3)}, y_1RLD.options());
    auto dv_P1RLD = torch::empty({units.parts, 1, units.rows, l.length, v_1RLD.size(3)}, v_1RLD.options());
    const int64_t count = units.count();
    std::vector<std::vector<torch::Tensor>> unit_param_grads(count);
    ForEachUnit(count, [&](int64_t i) {
      const auto u = units(i);
      const int64_t h0 = units.head0(u), nh = units.heads(u);
      const UnitSaved s{Take(x_1NLD, h0, nh), Take(y_1RLD, u.row0, u.rows), Take(v_1RLD, u.row0, u.rows),
                        TakeGrouped(out_1NLD, units, u), TakeGrouped(den_1NL, units, u),
                        Take(r_1RL, u.row0, u.rows).unsqueeze(2), TakeGrouped(g_1NLD, units, u)};
      const auto unit_params = UnitParams(map, params, units, u);
      const auto dx = Take(dx_1NLD, h0, nh), dy = Take(dy_P1RLD[u.part], u.row0, u.rows),
                 dv = Take(dv_P1RLD[u.part], u.row0, u.rows);
      // The raw kernel's forward left checkpoints: its backward reads them.
      unit_param_grads[i] = states_1RS.defined()
                                ? BackwardUnitRaw(unit_params, units.layout(l, u), s, Take(states_1RS, u.row0, u.rows),
                                                  Take(refs_1RN, u.row0, u.rows), chunk_size, dx, dy, dv)
                                : BackwardUnit(map, unit_params, units.layout(l, u), s, chunk_size, dx, dy, dv);
    });
    const auto dy_1RLD = units.parts == 1 ? dy_P1RLD[0] : dy_P1RLD.sum(0);
    const auto dv_1RLD = units.parts == 1 ? dv_P1RLD[0] : dv_P1RLD.sum(0);
    // Rows per query head: sum each KV head's group.
    auto per_kv_head = [&](const torch::Tensor& d_1RLD) {
      const auto d_1NLD = l.key_heads == 1
                              ? d_1RLD
                              : d_1RLD.view({1, l.kv_heads, l.group, l.length, d_1RLD.size(3)}).sum(2);
      return UnfoldBatch(d_1NLD, batch);
    };
    RecordDtype(ProbeField::kGradients, dx_1NLD);
    torch::autograd::variable_list grads = {UnfoldBatch(dx_1NLD, batch), per_kv_head(dy_1RLD), per_kv_head(dv_1RLD)};
    // Parameter gradients: summed over units, per-head ones into their heads' rows (serially),
    // then over the sequences that share them.
    for (size_t n = 0; n < params.size(); ++n) {
      const bool per_head = PerHead(map, n);
      torch::Tensor total;
      for (int64_t i = 0; i < count; ++i) {
        const auto& g = unit_param_grads[i][n];
        if (!g.defined()) continue;
        if (!total.defined()) total = torch::zeros_like(params[n], g.options());
        const auto u = units(i);
        (per_head ? total.narrow(0, units.head0(u), units.heads(u)) : total).add_(g);
      }
      if (total.defined() && per_head && batch > 1) {
        auto sizes = original[n].sizes().vec();
        sizes.insert(sizes.begin(), batch);
        total = total.view(sizes).sum(0);
      }
      grads.push_back(total);
    }
    grads.push_back({});  // map
    grads.push_back({});  // chunk_size
    return grads;
  }
};

}  // namespace

torch::Tensor FusedCausalLinearAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                         const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size) {
  DF_CHECK(chunk_size > 0, "FusedCausalLinearAttention: chunk_size must be positive, got " << chunk_size);
  // Features, running sums and the normaliser in fp32 (fp64 for fp64 inputs) whatever the inputs'
  // dtype, and no op inside autocast (a bf16 product folded into an fp32 state fails, or silently
  // loses the state's precision).
  NoAutocastGuard no_autocast;
  const auto dtype = FeatureDtype(x_BHLD.scalar_type());
  DF_CHECK(map.op != CausalOp::kNaive, "FusedCausalLinearAttention: op 'naive' is the kernel's composite path, not an operator form");
  ResetForwardDtypes();
  const bool parallel = map.op == CausalOp::kChunkParallel || (map.op == CausalOp::kAuto && !x_BHLD.is_cpu());
  if (parallel) return ChunkParallelCausalAttention(x_BHLD.to(dtype), y_BKLD.to(dtype), v_BKLD.to(dtype), map, chunk_size);
  return FusedCausalFunction::apply(x_BHLD.to(dtype), y_BKLD.to(dtype), v_BKLD.to(dtype), at::TensorList(map.params),
                                    map, chunk_size);
}

int64_t FusedCausalSavedBytes(const torch::Tensor& out) {
  const auto node = std::dynamic_pointer_cast<torch::autograd::CppNode<FusedCausalFunction>>(out.grad_fn());
  if (!node) return ChunkParallelSavedBytes(out);
  int64_t bytes = 0;
  for (const auto& t : node->ctx_.get_saved_variables()) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return bytes;
}

LinearAttentionState LinearAttentionPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                 const FeatureMap& map, int64_t num_query_heads,
                                                 int64_t chunk_size) {
  DF_CHECK(chunk_size > 0, "LinearAttentionPrefillState: chunk_size must be positive, got " << chunk_size);
  NoAutocastGuard no_autocast;
  const auto x_probe = y_BKLD.narrow(1, 0, 1).expand({y_BKLD.size(0), num_query_heads, y_BKLD.size(2), y_BKLD.size(3)});
  const auto l = MakeLayout(x_probe, y_BKLD, v_BKLD, map);
  KeyState state;
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto key = SplitKeys(KeyLogFeatures(map, map.params, y_BKLD.narrow(2, start, c), l));
    auto r_BKFC = std::get<0>(key.b_BKFC.cummax(-1));
    if (state.ref_BKF.defined()) r_BKFC = torch::maximum(r_BKFC, state.ref_BKF.unsqueeze(-1));
    state.Fold(key.k_BKFCM, key.b_BKFC, WithOnes(v_BKLD.narrow(2, start, c).to(key.k_BKFCM.scalar_type())),
               r_BKFC.select(-1, c - 1));
  }
  return {state.s_BKFMV, state.ref_BKF, l.length};
}

torch::Tensor LinearAttentionStep(LinearAttentionState& state, const torch::Tensor& x_BH1D,
                                  const torch::Tensor& y_BK1D, const torch::Tensor& v_BK1D, const FeatureMap& map) {
  NoAutocastGuard no_autocast;
  const auto l = MakeLayout(x_BH1D, y_BK1D, v_BK1D, map);
  DF_CHECK(l.length == 1, "LinearAttentionStep takes one token, got " << l.length);
  const auto key = SplitKeys(KeyLogFeatures(map, map.params, y_BK1D, l));
  // The new reference: the running max including this key (the state is rescaled down to it).
  const auto b_BKF = key.b_BKFC.squeeze(-1);
  const auto new_ref_BKF = state.ref_BKF.defined() ? torch::maximum(state.ref_BKF, b_BKF) : b_BKF;
  KeyState keys{state.state_BKFMV, state.ref_BKF};
  keys.Fold(key.k_BKFCM, key.b_BKFC, WithOnes(v_BK1D.to(key.k_BKFCM.scalar_type())), new_ref_BKF);
  state = {keys.s_BKFMV, keys.ref_BKF, state.tokens + 1};
  const auto q_BKG1M = ShiftedQueryFeatures(QueryLogFeatures(map, map.params, x_BH1D, l));
  const auto n_BKG1V = torch::matmul(q_BKG1M, state.state_BKFMV);
  const auto den_BKG1 = n_BKG1V.select(-1, l.value_dim).clamp_min(Tiny(n_BKG1V));
  return (n_BKG1V.narrow(-1, 0, l.value_dim) / den_BKG1.unsqueeze(-1)).reshape({l.batch, l.heads, 1, l.value_dim});
}

}  // namespace darkformer
