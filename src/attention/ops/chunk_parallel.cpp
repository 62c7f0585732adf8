// Chunk-parallel causal attention (see chunk_parallel.h). Layout: a key row is a KV head of one
// sequence (or a query head when key features are per query head), R = K such rows per sequence,
// G query heads each. Chunked tensors are B x R x N x ..., the query side with its G heads' C
// rows of a chunk side by side (Q = G C rows): every product below is one batched matmul over
// (B, R, N), and the sums over a row's query heads are contractions over those Q rows.
#include "attention/ops/chunk_parallel.h"

#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "attention/ops/dtype_probe.h"
#include "attention/ops/normaliser_check.h"
#include "util/error.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace {

struct Shape {
  int64_t batch, heads, rows, group, length, chunk, chunks, padded, value_dim;
};

Shape MakeShape(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& v, const FeatureMap& map,
                int64_t chunk_size) {
  DF_CHECK(x.dim() == 4 && y.dim() == 4 && v.dim() == 4,
           "ChunkParallelCausalAttention: x, y, v must be 4-D, got " << x.sizes() << ", " << y.sizes() << ", " << v.sizes());
  const int64_t heads = x.size(1), kv_heads = y.size(1), length = x.size(2);
  DF_CHECK(heads % kv_heads == 0 && y.size(0) == x.size(0) && v.size(0) == x.size(0) && v.size(1) == kv_heads &&
               y.size(2) == length && v.size(2) == length && y.size(3) == x.size(3) && length > 0,
           "ChunkParallelCausalAttention: shapes do not match: x " << x.sizes() << ", y " << y.sizes() << ", v " << v.sizes());
  DF_CHECK(chunk_size > 0, "ChunkParallelCausalAttention: chunk_size must be positive, got " << chunk_size);
  const int64_t rows = map.keys_per_query_head ? heads : kv_heads;
  const int64_t chunk = std::min(chunk_size, length), chunks = (length + chunk - 1) / chunk;
  return {x.size(0), heads, rows, heads / rows, length, chunk, chunks, chunks * chunk, v.size(3)};
}

// Zero-pads dim 2 (positions) of a B x N x L x X tensor to the chunked length.
torch::Tensor Pad(const torch::Tensor& t, const Shape& s) {
  return s.padded == s.length ? t : torch::constant_pad_nd(t, {0, 0, 0, s.padded - s.length});
}

// Query-side B x H x Lp x X <-> chunked B x R x N x (G C) x X.
torch::Tensor QueryChunks(const torch::Tensor& t, const Shape& s) {
  return t.view({s.batch, s.rows, s.group, s.chunks, s.chunk, t.size(-1)})
      .transpose(2, 3)
      .reshape({s.batch, s.rows, s.chunks, s.group * s.chunk, t.size(-1)});
}
torch::Tensor QueryUnchunk(const torch::Tensor& t, const Shape& s) {
  return t.view({s.batch, s.rows, s.chunks, s.group, s.chunk, t.size(-1)})
      .transpose(2, 3)
      .reshape({s.batch, s.heads, s.padded, t.size(-1)});
}
// A chunked query tensor with its G heads apart, for per-position key-row factors: B R N G C X.
torch::Tensor Heads(const torch::Tensor& t, const Shape& s) {
  return t.view({s.batch, s.rows, s.chunks, s.group, s.chunk, t.size(-1)});
}

// n x n: -inf on and above `diagonal` (triu's numbering), 0 below. Made once per size, dtype and
// device and kept (a few KiB): two launches fewer per call.
torch::Tensor Mask(int64_t n, int64_t diagonal, const torch::TensorOptions& options) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int, int, int>, torch::Tensor> masks;
  const auto key = std::make_tuple(n, diagonal, static_cast<int>(options.dtype().toScalarType()),
                                   static_cast<int>(options.device().type()), static_cast<int>(options.device().index()));
  std::lock_guard<std::mutex> lock(mutex);
  auto& mask = masks[key];
  if (!mask.defined()) {
    c10::InferenceMode no_autograd;
    mask = torch::full({n, n}, -std::numeric_limits<double>::infinity(), options).triu(diagonal);
  }
  return mask;
}

// Keys (and values) per key row: as given, or repeated per query head.
torch::Tensor PerRow(const torch::Tensor& t_BKLX, const Shape& s) {
  return t_BKLX.size(1) == s.rows ? t_BKLX : t_BKLX.repeat_interleave(s.rows / t_BKLX.size(1), 1);
}

torch::Tensor KeyLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params, const torch::Tensor& y) {
  return map.log_features(y, params, /*is_query=*/false);
}

// log phi of queries and keys, up to what cancels. Positive features (x W^T - |x|^2/2 - log(m)/2)
// skip the query's -|x|^2/2 (a per-query shift: the row max shift replaces it) and everyone's
// -log(m)/2 (a common factor of numerator and normaliser): 5 ops instead of 12.
std::pair<torch::Tensor, torch::Tensor> LogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                    const torch::Tensor& x, const torch::Tensor& y) {
  if (!map.positive_features) return {map.log_features(x, p, /*is_query=*/true), KeyLogFeatures(map, p, y)};
  const auto w_DM = p.at(0).detach().to(x.scalar_type()).t();
  auto lk = torch::matmul(y, w_DM);
  lk.sub_((y * y).sum(-1, /*keepdim=*/true), /*alpha=*/0.5);
  return {torch::matmul(x, w_DM), lk};
}

// What forward and backward both compute from the features (no autograd).
struct Chunked {
  torch::Tensor psi_BRNQM;   // exp(log phi(x_t) - its row max): the query's shift cancels in out_t
  torch::Tensor kt_BRNCM;    // k~_j = exp(l_j - r_j)
  torch::Tensor khat_BRNCM;  // exp(l_j - r_{e_c}) = k~_j exp(r_j - r_{e_c})
  torch::Tensor vh_BRNCV;    // [v_j, 1]
  torch::Tensor w_BRNCC;     // exp(r_j - r_t) for j <= t in a chunk, 0 above
  torch::Tensor e_BRNC;      // exp(r_j - r_{e_c})
  torch::Tensor read_BRNC;   // exp(r_{e_{c-1}} - r_t): the entering state's weight at t
  torch::Tensor decay_BRNN;  // exp(r_{e_c'} - r_{e_{c-1}}) for c' < c, 0 elsewhere
  torch::Tensor s_BRNMV;     // S_{c-1}, the state entering chunk c (0 for c = 0)
};

// 0 where `crossing` is false, -inf where it is true: the decay of -inf a document boundary puts
// between two positions (the factor exp(-inf) = 0 removes the pair exactly).
torch::Tensor CrossingBias(const torch::Tensor& crossing, const torch::TensorOptions& options) {
  return torch::zeros(crossing.sizes(), options).masked_fill_(crossing, -std::numeric_limits<double>::infinity());
}

// Document ids per chunk, B x 1 x N x C (broadcast over key rows); padded positions belong to
// the last document (they follow every real position: nothing real reads them).
torch::Tensor DocumentChunks(const torch::Tensor& document_ids_BL, const Shape& s) {
  auto ids = document_ids_BL.to(torch::kLong);
  if (s.padded != s.length) {
    ids = torch::cat({ids, ids.narrow(1, s.length - 1, 1).expand({s.batch, s.padded - s.length})}, 1);
  }
  return ids.view({s.batch, 1, s.chunks, s.chunk});
}

// The document of each chunk's last position e_c and of the previous chunk's, e_{c-1} (for the
// first chunk its own first position: nothing enters it anyway): B 1 N each.
std::pair<torch::Tensor, torch::Tensor> EndDocuments(const torch::Tensor& doc_B1NC, const Shape& s) {
  const auto end_B1N = doc_B1NC.select(-1, s.chunk - 1);
  const auto prev_B1N = torch::cat({doc_B1NC.select(-1, 0).narrow(-1, 0, 1), end_B1N.narrow(-1, 0, s.chunks - 1)}, -1);
  return {end_B1N, prev_B1N};
}

// The stabiliser's reference per document: r_t = max b_j over j <= t in t's document (causal, and
// blind to every other document). Exact maxima, no scan: inside a chunk a C x C masked max; into
// chunk c, the maxima of the earlier chunks' tails that lie in the document of e_{c-1}, an N x N
// masked max. Op count independent of L and of the number of documents.
torch::Tensor DocumentPrefixMax(const torch::Tensor& b_BRNC, const torch::Tensor& doc_B1NC, const Shape& s) {
  const auto options = b_BRNC.options();
  const auto inside_B1NCC = CrossingBias(doc_B1NC.unsqueeze(-1).ne(doc_B1NC.unsqueeze(-2)), options)
                                .add_(Mask(s.chunk, 1, options));  // [t][j]: later j and other documents out
  const auto in_BRNC = (b_BRNC.unsqueeze(-2) + inside_B1NCC).amax(-1);
  const auto [end_B1N, prev_B1N] = EndDocuments(doc_B1NC, s);
  const auto across_B1NN = CrossingBias(end_B1N.unsqueeze(-2).ne(prev_B1N.unsqueeze(-1)), options)
                               .add_(Mask(s.chunks, 0, options));  // [c][c']: c' < c, end of c' in e_{c-1}'s document
  const auto carried_BRN = (in_BRNC.select(-1, s.chunk - 1).unsqueeze(-2) + across_B1NN).amax(-1);
  const auto reads_B1NC = CrossingBias(doc_B1NC.ne(prev_B1N.unsqueeze(-1)), options);
  return torch::maximum(in_BRNC, carried_BRN.unsqueeze(-1) + reads_B1NC);
}

// lq_BHLM and lk_BRLM are consumed (shifted and exponentiated in place). doc_B1NC undefined: one
// document per row.
Chunked Build(torch::Tensor lq_BHLM, torch::Tensor lk_BRLM, const torch::Tensor& v_BRLD, const Shape& s,
              const torch::Tensor& doc_B1NC) {
  const int64_t m = lq_BHLM.size(-1), n = s.chunks, c = s.chunk, b = s.batch, r = s.rows;
  const auto options = lq_BHLM.options();
  const bool documents = doc_B1NC.defined();
  Chunked out;
  out.psi_BRNQM = QueryChunks(lq_BHLM.sub_(lq_BHLM.amax(-1, /*keepdim=*/true)).exp_(), s);
  const auto r_BRL = documents ? DocumentPrefixMax(lk_BRLM.amax(-1).view({b, r, n, c}), doc_B1NC, s).view({b, r, s.padded})
                               : std::get<0>(lk_BRLM.amax(-1).cummax(-1));
  const auto r_BRNC = r_BRL.view({b, r, n, c});
  const auto end_BRN = r_BRNC.select(-1, c - 1);
  // r_{e_{c-1}}; for the first chunk r_1 (any value <= its r_t: nothing enters it).
  const auto prev_BRN = torch::cat({r_BRNC.select(-1, 0).narrow(-1, 0, 1), end_BRN.narrow(-1, 0, n - 1)}, -1);
  out.kt_BRNCM = lk_BRLM.sub_(r_BRL.unsqueeze(-1)).exp_().view({b, r, n, c, m});
  out.vh_BRNCV = torch::cat({v_BRLD, torch::ones({b, r, s.padded, 1}, options)}, -1).view({b, r, n, c, -1});
  // Later positions get -inf before the exp: exp(r_j - r_t) of a later key could overflow.
  auto w_BRNCC = (r_BRNC.unsqueeze(-2) - r_BRNC.unsqueeze(-1)).add_(Mask(c, 1, options));
  auto e_BRNC = r_BRNC - end_BRN.unsqueeze(-1);
  auto read_BRNC = prev_BRN.unsqueeze(-1) - r_BRNC;
  auto decay_BRNN = (end_BRN.unsqueeze(-2) - prev_BRN.unsqueeze(-1)).add_(Mask(n, 0, options));
  if (documents) {
    // A document boundary is a decay of -inf: between positions of a chunk (block-diagonal),
    // from a key to its chunk's end state, from the entering state to a query, between chunks.
    const auto [end_B1N, prev_B1N] = EndDocuments(doc_B1NC, s);
    w_BRNCC.add_(CrossingBias(doc_B1NC.unsqueeze(-1).ne(doc_B1NC.unsqueeze(-2)), options));
    e_BRNC.add_(CrossingBias(doc_B1NC.ne(end_B1N.unsqueeze(-1)), options));
    read_BRNC.add_(CrossingBias(doc_B1NC.ne(prev_B1N.unsqueeze(-1)), options));
    decay_BRNN.add_(CrossingBias(end_B1N.unsqueeze(-2).ne(prev_B1N.unsqueeze(-1)), options));
  }
  out.w_BRNCC = w_BRNCC.exp_();
  out.e_BRNC = e_BRNC.exp_();
  out.khat_BRNCM = out.kt_BRNCM * out.e_BRNC.unsqueeze(-1);
  out.read_BRNC = read_BRNC.exp_();
  out.decay_BRNN = decay_BRNN.exp_();
  const auto u_BRNMV = torch::matmul(out.khat_BRNCM.transpose(-1, -2), out.vh_BRNCV);
  out.s_BRNMV = torch::matmul(out.decay_BRNN, u_BRNMV.view({b, r, n, -1})).view(u_BRNMV.sizes());
  RecordDtype(ProbeField::kFeatures, out.psi_BRNQM);
  RecordDtype(ProbeField::kState, out.s_BRNMV);
  return out;
}

// The masked intra-chunk matrix (psi_t . k~_j) exp(r_j - r_t): B R N Q C.
torch::Tensor IntraScores(const Chunked& k, const Shape& s) {
  auto a_BRNQC = torch::matmul(k.psi_BRNQM, k.kt_BRNCM.transpose(-1, -2));
  Heads(a_BRNQC, s).mul_(k.w_BRNCC.unsqueeze(3));
  return a_BRNQC;
}

// Per key row factor of each query position, broadcast over the row's G heads: B R N 1 C 1.
torch::Tensor PerPosition(const torch::Tensor& f_BRNC) { return f_BRNC.unsqueeze(3).unsqueeze(-1); }

class ChunkParallelFunction : public torch::autograd::Function<ChunkParallelFunction> {
 public:
  // Document ids ride as a non-tensor argument: an undefined tensor cannot be an autograd input.
  struct Documents {
    torch::Tensor ids_BL;
  };

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_BHLD,
                               const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD, at::TensorList params,
                               const FeatureMap& map, int64_t chunk_size, const Documents& documents) {
    const auto s = MakeShape(x_BHLD, y_BKLD, v_BKLD, map, chunk_size);
    const auto& document_ids_BL = documents.ids_BL;
    const auto doc_B1NC = document_ids_BL.defined() ? DocumentChunks(document_ids_BL, s) : torch::Tensor();
    const std::vector<torch::Tensor> p(params.begin(), params.end());
    const auto x = Pad(x_BHLD, s), y = Pad(PerRow(y_BKLD, s), s), v = Pad(PerRow(v_BKLD, s), s);
    auto [lq, lk] = LogFeatures(map, p, x, y);
    const auto k = Build(std::move(lq), std::move(lk), v, s, doc_B1NC);
    auto n_BRNQV = torch::matmul(IntraScores(k, s), k.vh_BRNCV);
    Heads(n_BRNQV, s).addcmul_(Heads(torch::matmul(k.psi_BRNQM, k.s_BRNMV), s), PerPosition(k.read_BRNC));
    // Rows below the guard take the per-feature form's values (normaliser_check.h).
    const auto den_BRNQ = causal_ops::GuardedDivisor(n_BRNQV.select(-1, s.value_dim));
    // Written through the chunked view of the output: no copy back to B H L D.
    auto out_BHLD = torch::empty({s.batch, s.heads, s.padded, s.value_dim}, x.options());
    auto out_view = out_BHLD.view({s.batch, s.rows, s.group, s.chunks, s.chunk, s.value_dim}).transpose(2, 3);
    torch::div_out(out_view, Heads(n_BRNQV.narrow(-1, 0, s.value_dim), s), Heads(den_BRNQ.unsqueeze(-1), s));
    RecordDtype(ProbeField::kInputs, x);
    RecordDtype(ProbeField::kNormaliser, den_BRNQ);
    causal_ops::RecordRowNormalisers(QueryUnchunk(den_BRNQ.unsqueeze(-1), s).squeeze(-1).narrow(2, 0, s.length));
    if (s.padded != s.length) out_BHLD = out_BHLD.narrow(2, 0, s.length);
    std::vector<torch::Tensor> saved = {x_BHLD, y_BKLD, v_BKLD, out_BHLD, den_BRNQ};
    saved.insert(saved.end(), p.begin(), p.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["chunk"] = chunk_size;
    if (doc_B1NC.defined()) ctx->saved_data["documents"] = document_ids_BL;
    ctx->saved_data["map"] = c10::IValue::make_capsule(c10::make_intrusive<MapCapsule>(map));
    return out_BHLD;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);

  // The feature map travels with the autograd node (the caller's copy is gone by the backward).
  struct MapCapsule : torch::CustomClassHolder {
    explicit MapCapsule(FeatureMap m) : map(std::move(m)) {}
    FeatureMap map;
  };
};

// dL/dx, dL/dy and the parameter gradients through the features, given d log phi of every
// (padded) query and key position.
struct FeatureGrads {
  torch::Tensor dx, dy;
  std::vector<torch::Tensor> params;
};

FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                             const torch::Tensor& y, const torch::Tensor& dlq_BHLM, const torch::Tensor& dlk_BRLM) {
  FeatureGrads g;
  g.params.resize(p.size());
  if (map.positive_features) {
    // log phi = x W^T - |x|^2/2 - log(m)/2 (FeatureMap::positive_features).
    const auto w_MD = p.at(0).detach().to(x.scalar_type());
    g.dx = torch::matmul(dlq_BHLM, w_MD).sub_(x * dlq_BHLM.sum(-1, /*keepdim=*/true));
    g.dy = torch::matmul(dlk_BRLM, w_MD).sub_(y * dlk_BRLM.sum(-1, /*keepdim=*/true));
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
  const auto lk = KeyLogFeatures(map, leaves, y_leaf);
  const auto grads = torch::autograd::grad({lq, lk}, inputs, {dlq_BHLM, dlk_BRLM}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
  g.dx = grads[0].defined() ? grads[0] : torch::zeros_like(x);
  g.dy = grads[1].defined() ? grads[1] : torch::zeros_like(y);
  for (size_t n = 0; n < which.size(); ++n) g.params[which[n]] = grads[n + 2];
  return g;
}

torch::autograd::variable_list ChunkParallelFunction::backward(torch::autograd::AutogradContext* ctx,
                                                               torch::autograd::variable_list grad_outputs) {
  const auto saved = ctx->get_saved_variables();
  const auto &x_BHLD = saved[0], &y_BKLD = saved[1], &v_BKLD = saved[2], &out_BHLD = saved[3], &den_BRNQ = saved[4];
  const std::vector<torch::Tensor> p(saved.begin() + 5, saved.end());
  const auto capsule = c10::static_intrusive_pointer_cast<MapCapsule>(ctx->saved_data["map"].toCapsule());
  const FeatureMap& map = capsule->map;
  const auto s = MakeShape(x_BHLD, y_BKLD, v_BKLD, map, ctx->saved_data["chunk"].toInt());
  // A backward called inside an autocast scope must not turn the recomputed features, states and
  // products bf16.
  NoAutocastGuard no_autocast;
  torch::NoGradGuard no_grad;
  const auto x = Pad(x_BHLD, s), y = Pad(PerRow(y_BKLD, s), s), v = Pad(PerRow(v_BKLD, s), s);
  const auto documents = ctx->saved_data.find("documents");
  const auto doc_B1NC =
      documents != ctx->saved_data.end() ? DocumentChunks(documents->second.toTensor(), s) : torch::Tensor();
  auto [lq, lk] = LogFeatures(map, p, x, y);
  const auto k = Build(std::move(lq), std::move(lk), v, s, doc_B1NC);
  // h_t = dL/dn_t = [g_t / den_t, -(g_t . out_t) / den_t] (padded positions: g = 0, so h = 0).
  const auto g_BHLD = grad_outputs[0].to(x.scalar_type());
  const auto inv_BRNQ1 = den_BRNQ.reciprocal().unsqueeze(-1);
  const auto dot_BHL1 = (g_BHLD * out_BHLD).sum(-1, /*keepdim=*/true);
  const auto h_BRNQV = torch::cat({QueryChunks(Pad(g_BHLD, s), s), QueryChunks(Pad(dot_BHL1, s), s).neg_()}, -1)
                           .mul_(inv_BRNQ1);
  const auto hread_BRNQV = (Heads(h_BRNQV, s) * PerPosition(k.read_BRNC)).view(h_BRNQV.sizes());
  // Queries: dpsi_t = sum_{j <= t} exp(r_j - r_t) (h_t . [v_j, 1]) k~_j + exp(r_{e_{c-1}} - r_t) S_{c-1} h_t.
  auto p_BRNQC = torch::matmul(h_BRNQV, k.vh_BRNCV.transpose(-1, -2));
  Heads(p_BRNQC, s).mul_(k.w_BRNCC.unsqueeze(3));
  auto dpsi_BRNQM = torch::matmul(p_BRNQC, k.kt_BRNCM).add_(torch::matmul(hread_BRNQV, k.s_BRNMV.transpose(-1, -2)));
  // Keys and values read the later chunks through T_c = sum_{t in c} exp(r_{e_{c-1}} - r_t) psi_t h_t^T,
  // brought back to chunk c by the transposed decay: Z_c = sum_{c' > c} exp(r_{e_c} - r_{e_{c'-1}}) T_c'.
  const auto t_BRNMV = torch::matmul(k.psi_BRNQM.transpose(-1, -2), hread_BRNQV);
  const auto z_BRNMV =
      torch::matmul(k.decay_BRNN.transpose(-1, -2), t_BRNMV.view({s.batch, s.rows, s.chunks, -1})).view(t_BRNMV.sizes());
  const auto a_BRNQC = IntraScores(k, s);
  auto dkt_BRNCM = torch::matmul(p_BRNQC.transpose(-1, -2), k.psi_BRNQM)
                       .add_(torch::matmul(k.vh_BRNCV * k.e_BRNC.unsqueeze(-1), z_BRNMV.transpose(-1, -2)));
  const auto dvh_BRNCV =
      torch::matmul(a_BRNQC.transpose(-1, -2), h_BRNQV).add_(torch::matmul(k.khat_BRNCM, z_BRNMV));
  // Through the shifts (held constant: out is exactly invariant to them): d log phi = dphi * phi.
  const auto dlq_BHLM = QueryUnchunk(dpsi_BRNQM.mul_(k.psi_BRNQM), s);
  const auto dlk_BRLM = dkt_BRNCM.mul_(k.kt_BRNCM).view({s.batch, s.rows, s.padded, -1});
  auto g = FeatureBackward(map, p, x, y, dlq_BHLM, dlk_BRLM);
  auto dv_BRLD = dvh_BRNCV.narrow(-1, 0, s.value_dim).reshape({s.batch, s.rows, s.padded, s.value_dim});
  auto unpad = [&](const torch::Tensor& t) { return s.padded == s.length ? t : t.narrow(2, 0, s.length); };
  // Rows per query head: each KV head's gradient is its group's sum.
  auto per_kv_head = [&](const torch::Tensor& t_BRLD) {
    const auto t = unpad(t_BRLD);
    const int64_t kv_heads = y_BKLD.size(1);
    if (t.size(1) == kv_heads) return t;
    return t.reshape({s.batch, kv_heads, s.rows / kv_heads, s.length, t.size(-1)}).sum(2);
  };
  RecordDtype(ProbeField::kGradients, g.dx);
  torch::autograd::variable_list grads = {unpad(g.dx), per_kv_head(g.dy), per_kv_head(dv_BRLD)};
  for (auto& pg : g.params) grads.push_back(pg);
  grads.push_back({});  // map
  grads.push_back({});  // chunk_size
  grads.push_back({});  // document_ids
  return grads;
}

}  // namespace

torch::Tensor ChunkParallelCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                           const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                           const torch::Tensor& document_ids_BL) {
  return ChunkParallelFunction::apply(x_BHLD, y_BKLD, v_BKLD, at::TensorList(map.params), map, chunk_size,
                                      ChunkParallelFunction::Documents{document_ids_BL});
}

int64_t ChunkParallelSavedBytes(const torch::Tensor& out) {
  const auto node = std::dynamic_pointer_cast<torch::autograd::CppNode<ChunkParallelFunction>>(out.grad_fn());
  if (!node) return 0;
  int64_t bytes = 0;
  for (const auto& t : node->ctx_.get_saved_variables()) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return bytes;
}

}  // namespace darkformer
