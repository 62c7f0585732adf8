// The per-feature stabiliser's chunk math (see per_feature_chunks.h).
#include "attention/ops/per_feature_chunks.h"

#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "util/error.h"

namespace darkformer::causal_ops {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// -inf where `masked(row, col)` for a rows x cols matrix, 0 elsewhere: rows x cols x 1, made
// once per shape, dtype and device and kept (two launches fewer per call).
torch::Tensor CachedBias(int kind, int64_t rows, int64_t cols, int64_t step, const torch::TensorOptions& options) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, int, int, int>, torch::Tensor> biases;
  const auto key = std::make_tuple(kind, rows, cols, step, static_cast<int>(options.dtype().toScalarType()),
                                   static_cast<int>(options.device().type()), static_cast<int>(options.device().index()));
  std::lock_guard<std::mutex> lock(mutex);
  auto& bias = biases[key];
  if (!bias.defined()) {
    c10::InferenceMode no_autograd;
    const auto i = torch::arange(rows, options.dtype(torch::kLong)).unsqueeze(1);
    const auto j = torch::arange(cols, options.dtype(torch::kLong)).unsqueeze(0);
    // kind 0: key j at or after sub-chunk i's start (i step); kind 1: key j after query i.
    const auto masked = kind == 0 ? j >= i * step : j > i;
    bias = torch::zeros({rows, cols}, options).masked_fill_(masked, kNegInf).unsqueeze(-1);
  }
  return bias;
}

struct Dims {
  int64_t b, r, n, u, g, s, c, m, v;
};
Dims DimsOf(const ChunkBlock& blk) {
  const auto& a = blk.a_BRNUGSM;
  return {a.size(0), a.size(1), a.size(2), a.size(3), a.size(4), a.size(5),
          blk.l_BRNCM.size(3), a.size(6), blk.vh_BRNCV.size(4)};
}

// The document of f_{u-1}, each sub-chunk's reference (for u = 0, its own first position: no key
// comes before it in the chunk): B 1 N U.
torch::Tensor ReferenceDocuments(const torch::Tensor& doc_B1NC, const Dims& d) {
  const auto doc = doc_B1NC.view({d.b, 1, d.n, d.u, d.s});
  const auto last = doc.select(-1, d.s - 1);
  return torch::cat({doc.select(-1, 0).narrow(-1, 0, 1), last.narrow(-1, 0, d.u - 1)}, -1);
}

}  // namespace

torch::Tensor CrossingBias(const torch::Tensor& crossing, const torch::TensorOptions& options) {
  return torch::zeros(crossing.sizes(), options).masked_fill_(crossing, kNegInf);
}

torch::Tensor PerFeaturePrefixMax(const torch::Tensor& l_BRLM, const torch::Tensor& doc_B1L) {
  if (!doc_B1L.defined()) return std::get<0>(l_BRLM.cummax(2));
  // One cummax over keys that order documents first and values second; its indices pick each
  // maximum's own value. fp32: the value's bits as an order-preserving integer below the
  // document's (int64, exact). fp64 (gradient checks): documents apart by more than the values'
  // range (rounding can then pick a key within ~1e-16 L max|l| of the maximum: still a key's value).
  const auto doc = doc_B1L.to(torch::kLong).unsqueeze(-1);
  torch::Tensor key;
  if (l_BRLM.scalar_type() == torch::kFloat32) {
    const auto bits = l_BRLM.contiguous().view(torch::kInt32).to(torch::kLong);
    // Negative floats order backwards as integers: flip their magnitude bits.
    const auto ordered = torch::where(bits < 0, bits.bitwise_xor(0x7fffffff), bits) + (int64_t{1} << 31);
    key = (doc * (int64_t{1} << 32)).add(ordered);
  } else {
    const auto spread = l_BRLM.abs().amax().mul(2).add(1);
    key = l_BRLM + doc.to(l_BRLM.scalar_type()) * spread;
  }
  return l_BRLM.gather(2, std::get<1>(key.cummax(2)));
}

ChunkTerms BuildChunkTerms(const ChunkBlock& blk) {
  const auto d = DimsOf(blk);
  const auto options = blk.l_BRNCM.options();
  const bool documents = blk.doc_B1NC.defined();
  const auto& a = blk.a_BRNUGSM;
  ChunkTerms t;
  // s_t = max_i (a_ti + R_i(t)); every argument below is (a + reference) - s, rounded as s's terms.
  t.s_BRNUGS = (a + blk.r_BRNCM.view({d.b, d.r, d.n, d.u, 1, d.s, d.m})).amax(-1);
  const auto s_1 = t.s_BRNUGS.unsqueeze(-1);
  // The sub-chunks' references R(f_{u-1}); the first sub-chunk has no key before it in the chunk
  // (its part 2 is masked whole) and takes its first position's R, finite and <= every R(t) there.
  const auto ends_BRNUM = blk.r_BRNCM.view({d.b, d.r, d.n, d.u, d.s, d.m}).select(4, d.s - 1);
  const auto rho_BRNUM = torch::cat({blk.r_BRNCM.narrow(3, 0, 1), ends_BRNUM.narrow(3, 0, d.u - 1)}, 3);
  torch::Tensor ref_doc_B1NU, doc_B1NUS;
  if (documents) {
    ref_doc_B1NU = ReferenceDocuments(blk.doc_B1NC, d);
    doc_B1NUS = blk.doc_B1NC.view({d.b, 1, d.n, d.u, d.s});
  }
  // Part 1's query factors.
  auto qc = (a + blk.prev_BRNM.view({d.b, d.r, d.n, 1, 1, 1, d.m})).sub_(s_1);
  if (documents) {
    qc.add_(CrossingBias(doc_B1NUS.ne(blk.prevdoc_B1N.view({d.b, 1, d.n, 1, 1})), options)
                .view({d.b, 1, d.n, d.u, 1, d.s, 1}));
  }
  t.qc_BRNQM = qc.exp_().view({d.b, d.r, d.n, d.u * d.g * d.s, d.m});
  // Part 2: keys before sub-chunk u against R(f_{u-1}), queries of u against the same.
  auto ku = (blk.l_BRNCM.view({d.b, d.r, d.n, 1, d.c, d.m}) - rho_BRNUM.unsqueeze(4))
                .add_(CachedBias(0, d.u, d.c, d.s, options));
  auto qu = (a + rho_BRNUM.view({d.b, d.r, d.n, d.u, 1, 1, d.m})).sub_(s_1);
  if (documents) {
    ku.add_(CrossingBias(blk.doc_B1NC.view({d.b, 1, d.n, 1, d.c}).ne(ref_doc_B1NU.unsqueeze(-1)), options).unsqueeze(-1));
    qu.add_(CrossingBias(doc_B1NUS.ne(ref_doc_B1NU.unsqueeze(-1)), options).view({d.b, 1, d.n, d.u, 1, d.s, 1}));
  }
  t.ku_BRNUCM = ku.exp_();
  t.qu_BRNUQM = qu.exp_().view({d.b, d.r, d.n, d.u, d.g * d.s, d.m});
  t.scores_BRNUQC = torch::matmul(t.qu_BRNUQM, t.ku_BRNUCM.transpose(-1, -2));
  // Part 3: the sub-chunk's own pairs, feature by feature.
  auto e = (a.view({d.b, d.r, d.n, d.u, d.g, d.s, 1, d.m}) + blk.l_BRNCM.view({d.b, d.r, d.n, d.u, 1, 1, d.s, d.m}))
               .sub_(s_1.unsqueeze(-1))
               .add_(CachedBias(1, d.s, d.s, 1, options));
  if (documents) {
    e.add_(CrossingBias(doc_B1NUS.unsqueeze(-1).ne(doc_B1NUS.unsqueeze(-2)), options)
               .view({d.b, 1, d.n, d.u, 1, d.s, d.s, 1}));
  }
  t.e_BRNUGSSM = e.exp_();
  t.w_BRNUGSS = t.e_BRNUGSSM.sum(-1);
  return t;
}

torch::Tensor ChunkNumerator(const ChunkBlock& blk, const ChunkTerms& t, const torch::Tensor& sin_BRNMV) {
  const auto d = DimsOf(blk);
  auto n = torch::matmul(t.scores_BRNUQC, blk.vh_BRNCV.unsqueeze(3));  // B R N U (G S) V
  n.add_(torch::matmul(t.w_BRNUGSS.view({d.b, d.r, d.n, d.u, d.g * d.s, d.s}),
                       blk.vh_BRNCV.view({d.b, d.r, d.n, d.u, d.s, d.v})));
  auto n_BRNQV = n.view({d.b, d.r, d.n, d.u * d.g * d.s, d.v});
  if (sin_BRNMV.defined()) n_BRNQV.add_(torch::matmul(t.qc_BRNQM, sin_BRNMV));
  return n_BRNQV;
}

torch::Tensor KeysAtChunkEnd(const ChunkBlock& blk) {
  const auto d = DimsOf(blk);
  auto kend = blk.l_BRNCM - blk.r_BRNCM.select(3, d.c - 1).unsqueeze(3);
  if (blk.doc_B1NC.defined()) {
    const auto end_doc = blk.doc_B1NC.select(-1, d.c - 1).unsqueeze(-1);
    kend.add_(CrossingBias(blk.doc_B1NC.ne(end_doc), kend.options()).unsqueeze(-1));
  }
  return kend.exp_();
}

QueryGrads ChunkQueryBackward(const ChunkBlock& blk, ChunkTerms& t, const torch::Tensor& h_BRNQV,
                              const torch::Tensor& sin_BRNMV) {
  const auto d = DimsOf(blk);
  QueryGrads q;
  const auto h_u = h_BRNQV.view({d.b, d.r, d.n, d.u, d.g * d.s, d.v});
  // Part 2: p = h [v, 1]^T against every key of the chunk (ku is 0 where the pair is not part 2's).
  q.p_BRNUQC = torch::matmul(h_u, blk.vh_BRNCV.unsqueeze(3).transpose(-1, -2));
  auto da = torch::matmul(q.p_BRNUQC, t.ku_BRNUCM).mul_(t.qu_BRNUQM);  // B R N U (G S) M
  // Part 3: e * (h_t . [v_j, 1]), summed over j for queries and over t (and heads) for keys.
  const auto pd = torch::matmul(h_u, blk.vh_BRNCV.view({d.b, d.r, d.n, d.u, d.s, d.v}).transpose(-1, -2));
  auto& ep = t.e_BRNUGSSM.mul_(pd.view({d.b, d.r, d.n, d.u, d.g, d.s, d.s, 1}));
  da.view({d.b, d.r, d.n, d.u, d.g, d.s, d.m}).add_(ep.sum(-2));
  q.dl_own_BRNCM = ep.sum({4, 5}).view({d.b, d.r, d.n, d.c, d.m});
  auto da_BRNQM = da.view({d.b, d.r, d.n, d.u * d.g * d.s, d.m});
  // Part 1.
  if (sin_BRNMV.defined()) da_BRNQM.add_(torch::matmul(h_BRNQV, sin_BRNMV.transpose(-1, -2)).mul_(t.qc_BRNQM));
  q.t_BRNMV = torch::matmul(t.qc_BRNQM.transpose(-1, -2), h_BRNQV);
  q.da_BRNUGSM = da.view({d.b, d.r, d.n, d.u, d.g, d.s, d.m});
  return q;
}

KeyGrads ChunkKeyBackward(const ChunkBlock& blk, const ChunkTerms& t, const QueryGrads& q, const torch::Tensor& h_BRNQV,
                          const torch::Tensor& kend_BRNCM, const torch::Tensor& z_BRNMV) {
  const auto d = DimsOf(blk);
  const auto h_u = h_BRNQV.view({d.b, d.r, d.n, d.u, d.g * d.s, d.v});
  KeyGrads k;
  k.dl_BRNCM = torch::matmul(q.p_BRNUQC.transpose(-1, -2), t.qu_BRNUQM).mul_(t.ku_BRNUCM).sum(3).add_(q.dl_own_BRNCM);
  k.dvh_BRNCV = torch::matmul(t.scores_BRNUQC.transpose(-1, -2), h_u).sum(3);
  // Part 3's values: w^T h with the sub-chunk's G heads as one contraction.
  const auto w_t = t.w_BRNUGSS.permute({0, 1, 2, 3, 6, 4, 5}).reshape({d.b, d.r, d.n, d.u, d.s, d.g * d.s});
  k.dvh_BRNCV.add_(torch::matmul(w_t, h_u).view({d.b, d.r, d.n, d.c, d.v}));
  if (z_BRNMV.defined()) {
    k.dl_BRNCM.add_(torch::matmul(blk.vh_BRNCV, z_BRNMV.transpose(-1, -2)).mul_(kend_BRNCM));
    k.dvh_BRNCV.add_(torch::matmul(kend_BRNCM, z_BRNMV));
  }
  return k;
}

}  // namespace darkformer::causal_ops
