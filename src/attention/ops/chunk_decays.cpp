// The sums over chunks, directly or in blocks of chunks (see chunk_decays.h).
#include "attention/ops/chunk_decays.h"

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "attention/ops/per_feature_chunks.h"
#include "util/error.h"

namespace darkformer::causal_ops {

namespace {

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

// -inf where the documents of a and b differ (broadcast), as a bias over the feature dimension.
torch::Tensor Crossing(const torch::Tensor& a, const torch::Tensor& b, const torch::TensorOptions& options) {
  return CrossingBias(a.ne(b), options).unsqueeze(2);
}

// Blocks of a blocked form: nb = N / b + 1 of them, so at least one padding chunk at every N (one
// path of ops at every length: chunk_parallel's op count does not grow with L).
int64_t BlocksOf(const ChunkDecays& d) { return d.chunks / d.block + 1; }

// t (.. x N) padded to `padded` along its last dimension by repeating its last entry.
torch::Tensor RepeatLastTo(const torch::Tensor& t, int64_t padded) {
  const int64_t n = t.size(-1);
  auto sizes = t.sizes().vec();
  sizes.back() = padded - n;
  return torch::cat({t, t.narrow(-1, n - 1, 1).expand(sizes)}, -1);
}

}  // namespace

int64_t DecayBlockChunks(int64_t chunks) {
  if (chunks <= kDirectChunks) return 0;
  auto b = static_cast<int64_t>(std::sqrt(static_cast<double>(chunks)));
  while (b * b < chunks) ++b;
  return b;
}

int64_t DecayFloatsPerFeature(int64_t chunks) {
  const int64_t b = DecayBlockChunks(chunks);
  if (b == 0) return chunks * chunks;
  const int64_t nb = chunks / b + 1;
  return nb * b * (b + 1) + (nb - 1) * (nb - 1);  // the padded R and the local decays; the carries
}

ChunkDecays MakeChunkDecays(const torch::Tensor& end_BRMN, const torch::Tensor& end_doc_B1N) {
  return MakeChunkDecays(end_BRMN, end_doc_B1N, DecayBlockChunks(end_BRMN.size(-1)));
}

ChunkDecays MakeChunkDecays(const torch::Tensor& end_BRMN, const torch::Tensor& end_doc_B1N, int64_t block) {
  DF_CHECK(end_BRMN.dim() == 4 && block >= 0, "MakeChunkDecays: end_BRMN " << end_BRMN.sizes() << ", block " << block);
  const auto options = end_BRMN.options();
  ChunkDecays d;
  d.chunks = end_BRMN.size(-1);
  d.block = block;
  const int64_t n = d.chunks;
  if (block == 0) {
    // From a contiguous copy: the decays then come out contiguous, so the batched products read
    // them without a copy per feature (which LibTorch's bmm makes of strided batches at some
    // sizes only). R(e_{c-1}) per chunk c; chunk 0's row is masked whole, so any finite value
    // stands there.
    const auto end = end_BRMN.contiguous();
    const auto prev_BRMN = torch::cat({end.narrow(-1, 0, 1), end.narrow(-1, 0, n - 1)}, -1);
    auto dec = (end.unsqueeze(-2) - prev_BRMN.unsqueeze(-1)).add_(Mask(n, 0, options));
    if (end_doc_B1N.defined()) {
      const auto prev_doc = torch::cat({end_doc_B1N.narrow(-1, 0, 1), end_doc_B1N.narrow(-1, 0, n - 1)}, -1);
      dec.add_(Crossing(end_doc_B1N.unsqueeze(-2), prev_doc.unsqueeze(-1), options));
    }
    d.dec_BRMNN = dec.exp_();
    return d;
  }
  const int64_t nb = BlocksOf(d), b = block;
  // Contiguous (cat's), whatever end_BRMN's strides.
  d.end_BRMKB = RepeatLastTo(end_BRMN, nb * b).view({end_BRMN.size(0), end_BRMN.size(1), end_BRMN.size(2), nb, b});
  // [k, i, i'] = R(e_i') - R(e_i) for i' <= i in block k: <= 0 inside a document.
  auto local = (d.end_BRMKB.unsqueeze(-2) - d.end_BRMKB.unsqueeze(-1)).add_(Mask(b, 1, options));
  if (end_doc_B1N.defined()) {
    d.doc_B1KB = RepeatLastTo(end_doc_B1N, nb * b).view({end_doc_B1N.size(0), 1, nb, b});
    local.add_(Crossing(d.doc_B1KB.unsqueeze(-2), d.doc_B1KB.unsqueeze(-1), options));
  }
  d.local_BRMKBB = local.exp_();
  return d;
}

torch::Tensor EnteringStates(const ChunkDecays& d, const torch::Tensor& u_BRMNV) {
  if (d.block == 0) return torch::matmul(d.dec_BRMNN, u_BRMNV).transpose(2, 3).contiguous();
  const auto options = u_BRMNV.options();
  const int64_t n = d.chunks, b = d.block, nb = BlocksOf(d), v = u_BRMNV.size(-1);
  const auto& end = d.end_BRMKB;
  const auto sizes = end.sizes();
  // I_c = sum_{c' <= c} exp(R(e_c') - R(e_c)) U_c', first inside each block (the padding's U: 0).
  const auto u = torch::constant_pad_nd(u_BRMNV, {0, 0, 0, nb * b - n}).view({sizes[0], sizes[1], sizes[2], nb, b, v});
  auto sums = torch::matmul(d.local_BRMKBB, u);  // B R M nb b V
  // What enters block r + 1 from blocks 0..r, relative to R at block r's end: sum_{k <= r}
  // exp(R_last(k) - R_last(r)) I_last(k), I_last(k) block k's own sums at its last chunk, r = 0 .. nb - 2.
  const auto last = end.select(-1, b - 1).narrow(-1, 0, nb - 1);
  auto carry = (last.unsqueeze(-2) - last.unsqueeze(-1)).add_(Mask(nb - 1, 1, options));
  // Each chunk c of block k >= 1 takes it with exp(R_last(k - 1) - R(e_c)) <= 1.
  auto share = last.unsqueeze(-1) - end.narrow(-2, 1, nb - 1);
  if (d.doc_B1KB.defined()) {
    const auto last_doc = d.doc_B1KB.select(-1, b - 1).narrow(-1, 0, nb - 1);
    carry.add_(Crossing(last_doc.unsqueeze(-2), last_doc.unsqueeze(-1), options));
    share.add_(Crossing(last_doc.unsqueeze(-1), d.doc_B1KB.narrow(-2, 1, nb - 1), options));
  }
  const auto entering = torch::matmul(carry.exp_(), sums.select(-2, b - 1).narrow(-2, 0, nb - 1));  // B R M nb-1 V
  sums.narrow(3, 1, nb - 1).addcmul_(share.exp_().unsqueeze(-1), entering.unsqueeze(-2));
  // S_c = I_{c-1}, S_0 = 0, written chunk-major as it is moved.
  auto states = torch::empty({sizes[0], sizes[1], n, sizes[2], v}, options);
  states.select(2, 0).zero_();
  states.narrow(2, 1, n - 1).copy_(sums.view({sizes[0], sizes[1], sizes[2], nb * b, v}).narrow(3, 0, n - 1).transpose(2, 3));
  return states;
}

torch::Tensor ReverseStates(const ChunkDecays& d, const torch::Tensor& t_BRMNV) {
  if (d.block == 0) return torch::matmul(d.dec_BRMNN.transpose(-1, -2), t_BRMNV).transpose(2, 3).contiguous();
  const auto options = t_BRMNV.options();
  const int64_t n = d.chunks, b = d.block, nb = BlocksOf(d), v = t_BRMNV.size(-1);
  const auto& end = d.end_BRMKB;
  const auto sizes = end.sizes();
  // Z_c = sum_{j >= c} exp(R(e_c) - R(e_j)) T_{j+1} (T_N = 0, and the padding's): first inside
  // each block, with the local decays transposed.
  const auto t = torch::constant_pad_nd(t_BRMNV.narrow(3, 1, n - 1), {0, 0, 0, nb * b - n + 1})
                     .view({sizes[0], sizes[1], sizes[2], nb, b, v});
  auto sums = torch::matmul(d.local_BRMKBB.transpose(-1, -2), t);  // B R M nb b V
  // What block k gets from blocks k' > k, relative to R at block k's end, k = 0 .. nb - 2: sum_{k' > k}
  // exp(R_last(k) - R_first(k')) Z_first(k'), Z_first(k') block k''s own sums at its first chunk
  // (the later blocks' index r' = k' - 1 >= k).
  const auto last = end.select(-1, b - 1).narrow(-1, 0, nb - 1);
  const auto first = end.select(-1, 0).narrow(-1, 1, nb - 1);
  auto carry = (last.unsqueeze(-1) - first.unsqueeze(-2)).add_(Mask(nb - 1, 1, options).t());
  // Each chunk c of block k <= nb - 2 takes it with exp(R(e_c) - R_last(k)) <= 1.
  auto share = end.narrow(-2, 0, nb - 1) - last.unsqueeze(-1);
  if (d.doc_B1KB.defined()) {
    const auto last_doc = d.doc_B1KB.select(-1, b - 1).narrow(-1, 0, nb - 1);
    const auto first_doc = d.doc_B1KB.select(-1, 0).narrow(-1, 1, nb - 1);
    carry.add_(Crossing(last_doc.unsqueeze(-1), first_doc.unsqueeze(-2), options));
    share.add_(Crossing(d.doc_B1KB.narrow(-2, 0, nb - 1), last_doc.unsqueeze(-1), options));
  }
  const auto later = torch::matmul(carry.exp_(), sums.select(-2, 0).narrow(-2, 1, nb - 1));  // B R M nb-1 V
  sums.narrow(3, 0, nb - 1).addcmul_(share.exp_().unsqueeze(-1), later.unsqueeze(-2));
  return sums.view({sizes[0], sizes[1], sizes[2], nb * b, v}).narrow(3, 0, n).transpose(2, 3).contiguous();
}

}  // namespace darkformer::causal_ops
