// Chunk-parallel causal attention (see chunk_parallel.h). Layout: a key row is a KV head of one
// sequence (or a query head when key features are per query head), R = K such rows per sequence,
// G query heads each. Chunked tensors are B x R x N x ..., the query side in
// per_feature_chunks.h's blocks (a sub-chunk's G heads together): every product below is one
// batched matmul over (B, R, N), and the sums over a row's query heads are contractions over rows.
#include "attention/ops/chunk_parallel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "attention/ops/chunk_decays.h"
#include "attention/ops/dtype_probe.h"
#include "attention/ops/feature_gradients.h"
#include "attention/ops/fp32_products.h"
#include "attention/ops/per_feature_chunks.h"
#include "attention/ops/saved_bytes.h"
#include "util/error.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace {

struct Shape {
  int64_t batch, heads, rows, group, length, chunk, chunks, padded, value_dim, sub, subs;
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
  const int64_t sub = causal_ops::SubChunk(chunk);
  return {x.size(0), heads, rows, heads / rows, length, chunk, chunks, chunks * chunk, v.size(3), sub, chunk / sub};
}

// The call's sizes for ChunkParallelWorkingBytes, m features.
ChunkParallelDims DimsOf(const Shape& s, int64_t features) {
  return {s.batch, s.length, s.heads, s.rows, features, s.value_dim, s.chunk};
}

// A slice of the call: whole sequences, or key rows of one sequence (with their query heads), as
// ChunkParallelSlice says; its shape, and its part of a tensor per key row (B x R x ...), per query
// head (B x H x ...) or per sequence (B x 1 x ...). Each part is contiguous where the tensor is.
struct Slice {
  int64_t first_sequence, first_row;
  Shape part;
  torch::Tensor Rows(const torch::Tensor& t) const { return Sequences(t).narrow(1, first_row, part.rows); }
  torch::Tensor Heads(const torch::Tensor& t) const {
    return Sequences(t).narrow(1, first_row * part.group, part.heads);
  }
  torch::Tensor Sequences(const torch::Tensor& t) const {
    return t.defined() ? t.narrow(0, first_sequence, part.batch) : t;
  }
};
std::vector<Slice> Slices(const Shape& s, int64_t features, int64_t budget) {
  const int64_t rows = ChunkParallelSlice(DimsOf(s, features), budget);
  std::vector<Slice> slices;
  if (rows >= s.rows) {
    const int64_t each = rows / s.rows;
    for (int64_t b0 = 0; b0 < s.batch; b0 += each) {
      Shape part = s;
      part.batch = std::min(each, s.batch - b0);
      slices.push_back({b0, 0, part});
    }
    return slices;
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t r0 = 0; r0 < s.rows; r0 += rows) {
      Shape part = s;
      part.batch = 1, part.rows = std::min(rows, s.rows - r0), part.heads = part.rows * s.group;
      slices.push_back({b, r0, part});
    }
  }
  return slices;
}

// Zero-pads dim 2 (positions) of a B x N x L x X tensor to the chunked length.
torch::Tensor Pad(const torch::Tensor& t, const Shape& s) {
  return s.padded == s.length ? t : torch::constant_pad_nd(t, {0, 0, 0, s.padded - s.length});
}

// Query side B x H x Lp x X <-> blocks B x R x N x U x G x S x X (per_feature_chunks.h's layout).
torch::Tensor QueryBlocks(const torch::Tensor& t, const Shape& s) {
  return t.reshape({s.batch, s.rows, s.group, s.chunks, s.subs, s.sub, t.size(-1)})
      .permute({0, 1, 3, 4, 2, 5, 6})
      .contiguous();
}
// The blocks as a permuted view in B x R x G x N x U x S x X order (reshape it to B H Lp X).
torch::Tensor QueryBlocksByHead(const torch::Tensor& t_BRNUGSX) { return t_BRNUGSX.permute({0, 1, 4, 2, 3, 5, 6}); }

// What forward and backward both compute from the features (no autograd).
struct Chunked {
  causal_ops::ChunkBlock block;
  causal_ops::ChunkTerms terms;
  torch::Tensor kend_BRNCM;  // exp(l_j - R(e_c)): keys against their chunk's end
  causal_ops::ChunkDecays decays;  // the per-feature decays between chunks (chunk_decays.h)
  torch::Tensor sin_BRNMV;         // S(e_{c-1}), the state entering chunk c (0 for c = 0)
};

// Document ids per position, B x 1 x Lp; padded positions belong to the last document (they
// follow every real position: nothing real reads them).
torch::Tensor PaddedDocuments(const torch::Tensor& document_ids_BL, const Shape& s) {
  auto ids = document_ids_BL.to(torch::kLong);
  if (s.padded != s.length) {
    ids = torch::cat({ids, ids.narrow(1, s.length - 1, 1).expand({s.batch, s.padded - s.length})}, 1);
  }
  return ids.unsqueeze(1);
}

// lq_BHLM and lk_BRLM: log-features; doc_B1L undefined: one document per row.
Chunked Build(const torch::Tensor& lq_BHLM, const torch::Tensor& lk_BRLM, const torch::Tensor& v_BRLD, const Shape& s,
              const torch::Tensor& doc_B1L) {
  const int64_t m = lq_BHLM.size(-1), n = s.chunks, c = s.chunk, b = s.batch, r = s.rows;
  const auto options = lq_BHLM.options();
  Chunked k;
  auto& blk = k.block;
  blk.group = s.group;
  blk.sub = s.sub;
  blk.a_BRNUGSM = QueryBlocks(lq_BHLM, s);
  blk.l_BRNCM = lk_BRLM.view({b, r, n, c, m});
  blk.r_BRNCM = causal_ops::PerFeaturePrefixMax(lk_BRLM, doc_B1L).view({b, r, n, c, m});
  blk.vh_BRNCV = torch::cat({v_BRLD, torch::ones({b, r, s.padded, 1}, options)}, -1).view({b, r, n, c, -1});
  const auto end_BRNM = blk.r_BRNCM.select(3, c - 1);
  blk.prev_BRNM = torch::cat({blk.r_BRNCM.select(3, 0).narrow(2, 0, 1), end_BRNM.narrow(2, 0, n - 1)}, 2);
  torch::Tensor end_doc_B1N;
  if (doc_B1L.defined()) {
    blk.doc_B1NC = doc_B1L.view({b, 1, n, c});
    end_doc_B1N = blk.doc_B1NC.select(-1, c - 1);
    blk.prevdoc_B1N = torch::cat({blk.doc_B1NC.select(-1, 0).narrow(-1, 0, 1), end_doc_B1N.narrow(-1, 0, n - 1)}, -1);
  }
  k.terms = causal_ops::BuildChunkTerms(blk);
  k.kend_BRNCM = causal_ops::KeysAtChunkEnd(blk);
  // Chunk states relative to their own end, then the state entering each chunk: the per-feature
  // decayed sums over the chunks before it (chunk_decays.h: one product with N x N decays, or in
  // blocks of chunks for long rows; a document boundary between e_c' and e_{c-1} is a 0).
  const auto u_BRMNV = torch::matmul(k.kend_BRNCM.transpose(-1, -2), blk.vh_BRNCV).transpose(2, 3);
  k.decays = causal_ops::MakeChunkDecays(end_BRNM.transpose(2, 3), end_doc_B1N);
  k.sin_BRNMV = causal_ops::EnteringStates(k.decays, u_BRMNV);
  RecordDtype(ProbeField::kFeatures, k.terms.qc_BRNQM);
  RecordDtype(ProbeField::kState, k.sin_BRNMV);
  return k;
}

class ChunkParallelFunction : public torch::autograd::Function<ChunkParallelFunction> {
 public:
  // Document ids ride as a non-tensor argument: an undefined tensor cannot be an autograd input.
  struct Documents {
    torch::Tensor ids_BL;
  };

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_BHLD,
                               const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD, at::TensorList params,
                               const FeatureMap& map, int64_t chunk_size, const Documents& documents,
                               int64_t slice_bytes) {
    const auto s = MakeShape(x_BHLD, y_BKLD, v_BKLD, map, chunk_size);
    const auto& document_ids_BL = documents.ids_BL;
    const auto doc_B1L = document_ids_BL.defined() ? PaddedDocuments(document_ids_BL, s) : torch::Tensor();
    const std::vector<torch::Tensor> p(params.begin(), params.end());
    const auto x = Pad(x_BHLD, s), y = Pad(causal_ops::PerRow(y_BKLD, s.rows), s), v = Pad(causal_ops::PerRow(v_BKLD, s.rows), s);
    const auto [lq, lk] = causal_ops::LogFeatures(map, p, x, y);
    // Written through the blocked view of the output: no copy back to B H L D.
    auto out_BHLD = torch::empty({s.batch, s.heads, s.padded, s.value_dim}, x.options());
    const int64_t q_rows = s.subs * s.group * s.sub;
    const auto den_BRNQ = torch::empty({s.batch, s.rows, s.chunks, q_rows}, x.options());
    for (const auto& slice : Slices(s, lq.size(-1), slice_bytes)) {
      const auto& part = slice.part;
      const auto k = Build(slice.Heads(lq), slice.Rows(lk), slice.Rows(v), part, slice.Sequences(doc_B1L));
      const auto n_BRNQV = causal_ops::ChunkNumerator(k.block, k.terms, k.sin_BRNMV);
      const auto den = slice.Rows(den_BRNQ);
      den.copy_(n_BRNQV.select(-1, s.value_dim));  // >= 1 (per_feature_chunks.h)
      auto out_view = slice.Heads(out_BHLD)
                          .view({part.batch, part.rows, s.group, s.chunks, s.subs, s.sub, s.value_dim})
                          .permute({0, 1, 3, 4, 2, 5, 6});
      const auto blocks = [&](const torch::Tensor& t) {
        return t.view({part.batch, part.rows, s.chunks, s.subs, s.group, s.sub, t.size(-1)});
      };
      torch::div_out(out_view, blocks(n_BRNQV.narrow(-1, 0, s.value_dim)), blocks(den.unsqueeze(-1)));
    }
    RecordDtype(ProbeField::kInputs, x);
    RecordDtype(ProbeField::kNormaliser, den_BRNQ);
    if (s.padded != s.length) out_BHLD = out_BHLD.narrow(2, 0, s.length);
    std::vector<torch::Tensor> saved = {x_BHLD, y_BKLD, v_BKLD, out_BHLD, den_BRNQ};
    saved.insert(saved.end(), p.begin(), p.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["chunk"] = chunk_size;
    ctx->saved_data["slice_bytes"] = slice_bytes;
    if (doc_B1L.defined()) ctx->saved_data["documents"] = document_ids_BL;
    SaveFeatureMap(ctx, map);
    return out_BHLD;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

torch::autograd::variable_list ChunkParallelFunction::backward(torch::autograd::AutogradContext* ctx,
                                                               torch::autograd::variable_list grad_outputs) {
  const auto saved = ctx->get_saved_variables();
  const auto &x_BHLD = saved[0], &y_BKLD = saved[1], &v_BKLD = saved[2], &out_BHLD = saved[3], &den_BRNQ = saved[4];
  const std::vector<torch::Tensor> p(saved.begin() + 5, saved.end());
  const FeatureMap& map = SavedFeatureMap(ctx);
  const auto s = MakeShape(x_BHLD, y_BKLD, v_BKLD, map, ctx->saved_data["chunk"].toInt());
  // A backward called inside an autocast scope must not turn the recomputed features, states and
  // products bf16; nor a run's TF32 take their operands (fp32_products.h).
  NoAutocastGuard no_autocast;
  NoTf32Scope fp32_products;
  torch::NoGradGuard no_grad;
  const auto x = Pad(x_BHLD, s), y = Pad(causal_ops::PerRow(y_BKLD, s.rows), s), v = Pad(causal_ops::PerRow(v_BKLD, s.rows), s);
  const auto documents = ctx->saved_data.find("documents");
  const auto doc_B1L =
      documents != ctx->saved_data.end() ? PaddedDocuments(documents->second.toTensor(), s) : torch::Tensor();
  const auto [lq, lk] = causal_ops::LogFeatures(map, p, x, y);
  const int64_t m = lq.size(-1), q_rows = s.subs * s.group * s.sub;
  const auto g_BHLD = grad_outputs[0].to(x.scalar_type());
  const auto dot_BHL1 = Pad((g_BHLD * out_BHLD).sum(-1, /*keepdim=*/true), s);
  const auto g_padded_BHLD = Pad(g_BHLD, s);
  const auto slices = Slices(s, m, ctx->saved_data["slice_bytes"].toInt());
  // One slice: the gradients are the slice's own tensors; else each slice's go into the whole's.
  torch::Tensor dlq_BHLM, dlk_BRLM, dvh_BRLV;
  if (slices.size() > 1) {
    dlq_BHLM = torch::empty({s.batch, s.heads, s.padded, m}, x.options());
    dlk_BRLM = torch::empty({s.batch, s.rows, s.padded, m}, x.options());
    dvh_BRLV = torch::empty({s.batch, s.rows, s.padded, s.value_dim + 1}, x.options());
  }
  for (const auto& slice : slices) {
    const auto& part = slice.part;
    auto k = Build(slice.Heads(lq), slice.Rows(lk), slice.Rows(v), part, slice.Sequences(doc_B1L));
    // h_t = dL/dn_t = [g_t / den_t, -(g_t . out_t) / den_t] (padded positions: g = 0, so h = 0).
    const auto h_BRNQV = torch::cat({QueryBlocks(slice.Heads(g_padded_BHLD), part),
                                     QueryBlocks(slice.Heads(dot_BHL1), part).neg_()}, -1)
                             .view({part.batch, part.rows, s.chunks, q_rows, s.value_dim + 1})
                             .div_(slice.Rows(den_BRNQ).unsqueeze(-1));
    auto q = causal_ops::ChunkQueryBackward(k.block, k.terms, h_BRNQV, k.sin_BRNMV);
    // Keys read the later chunks through their T_c' = sum_{t in c'} qc_t h_t^T, brought back to
    // chunk c by the transposed decays: Z_c = sum_{c' > c} exp(R(e_c) - R(e_{c'-1})) T_c'.
    const auto z_BRNMV = causal_ops::ReverseStates(k.decays, q.t_BRNMV.transpose(2, 3));
    const auto kg = causal_ops::ChunkKeyBackward(k.block, k.terms, q, h_BRNQV, k.kend_BRNCM, z_BRNMV);
    auto dlq = QueryBlocksByHead(q.da_BRNUGSM).reshape({part.batch, part.heads, s.padded, m});
    auto dlk = kg.dl_BRNCM.view({part.batch, part.rows, s.padded, m});
    auto dvh = kg.dvh_BRNCV.view({part.batch, part.rows, s.padded, s.value_dim + 1});
    if (slices.size() == 1) {
      dlq_BHLM = std::move(dlq), dlk_BRLM = std::move(dlk), dvh_BRLV = std::move(dvh);
    } else {
      slice.Heads(dlq_BHLM).copy_(dlq), slice.Rows(dlk_BRLM).copy_(dlk), slice.Rows(dvh_BRLV).copy_(dvh);
    }
  }
  auto g = causal_ops::FeatureBackward(map, p, x, y, dlq_BHLM, dlk_BRLM);
  auto dv_BRLD = dvh_BRLV.narrow(-1, 0, s.value_dim).contiguous();
  auto unpad = [&](const torch::Tensor& t) { return s.padded == s.length ? t : t.narrow(2, 0, s.length); };
  // Rows per query head: each KV head's gradient is its group's sum.
  auto per_kv_head = [&](const torch::Tensor& t_BRLD) { return causal_ops::PerKvHead(unpad(t_BRLD), y_BKLD.size(1)); };
  RecordDtype(ProbeField::kGradients, g.dx);
  torch::autograd::variable_list grads = {unpad(g.dx), per_kv_head(g.dy), per_kv_head(dv_BRLD)};
  for (auto& pg : g.params) grads.push_back(pg);
  grads.push_back({});  // map
  grads.push_back({});  // chunk_size
  grads.push_back({});  // document_ids
  grads.push_back({});  // slice_bytes
  return grads;
}

}  // namespace

int64_t ChunkParallelWorkingBytes(const ChunkParallelDims& d, int64_t slice_rows) {
  const int64_t m = d.features, v = d.value_dim + 1, chunk = std::min(d.chunk, d.length), group = d.heads / d.rows;
  const int64_t chunks = (d.length + chunk - 1) / chunk, sub = causal_ops::SubChunk(chunk), subs = chunk / sub;
  const int64_t whole = d.batch * d.length * (d.heads * 2 * m + d.rows * (2 * m + v));
  const int64_t per_row = d.length * (group * ((3 + sub) * m + 2 * chunk + 2 * v) + (2 + 2 * subs) * m) +
                          m * causal_ops::DecayFloatsPerFeature(chunks) + 3 * chunks * m * v;
  return 4 * (whole + slice_rows * per_row);  // fp32
}

int64_t ChunkParallelSlice(const ChunkParallelDims& d, int64_t budget) {
  const int64_t per_row = std::max<int64_t>(ChunkParallelWorkingBytes(d, 1) - ChunkParallelWorkingBytes(d, 0), 1);
  const int64_t fits = std::max<int64_t>(budget / per_row, 1);
  // Whole sequences where one fits, as many as fit; else a sequence's rows in even groups.
  const int64_t unit = fits >= d.rows ? d.rows : 1, count = fits >= d.rows ? d.batch : d.rows;
  const int64_t each = std::min(fits / unit, count), slices = (count + each - 1) / each;
  return unit * ((count + slices - 1) / slices);
}

torch::Tensor ChunkParallelCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                           const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                           const torch::Tensor& document_ids_BL, int64_t slice_bytes) {
  return ChunkParallelFunction::apply(x_BHLD, y_BKLD, v_BKLD, at::TensorList(map.params), map, chunk_size,
                                      ChunkParallelFunction::Documents{document_ids_BL}, slice_bytes);
}

int64_t ChunkParallelSavedBytes(const torch::Tensor& out) {
  return causal_ops::SavedBytesOf<ChunkParallelFunction>(out);
}

}  // namespace darkformer
