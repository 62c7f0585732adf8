// The chunk-parallel form's sums over chunks (chunk_parallel.h): the states entering the chunks
// from the chunks' own states, and the backward's reverse states, per feature with the running
// max's decays. Per feature i and key row, with R(e_c) the running max at chunk c's last position
// (a prefix max: it never decreases inside a document) and U_c chunk c's own state relative to it:
//   S_c = sum_{c' < c} exp(R(e_c') - R(e_{c-1})) U_c'      (the state entering chunk c)
//   Z_c = sum_{c' > c} exp(R(e_c) - R(e_{c'-1})) T_c'      (the later chunks' T, brought back to c)
// over chunks of one document only (a boundary between them: the term is 0). Every factor is <= 1.
//
// Directly, each is one product with the N x N decays per feature: m N^2 (D + 1) multiply-adds
// and m N^2 floats per key row, quadratic in L / C (at 32k positions in chunks of 64, N = 512,
// m = D = 256: 268 MB of decays and 17 G multiply-adds per key row and sum; darkformer's 8 rows
// and three sums a call, 12 ms at an H200's fp32 peak, of the 44.9 ms its call took there). In
// blocks of b chunks, the same sums take three steps: each block's own inclusive sums (b x b
// decays), the sums entering each block from the blocks before (nb x nb, nb = N / b + 1), and each
// chunk's share of its block's entering sum (a factor <= 1): m N (b + 1) (D + 1) + m nb^2 (D + 1)
// multiply-adds and m (N b + nb^2) floats, about 2 m N^1.5 at b = ceil(sqrt(N)). The blocked form
// takes about a dozen more ops, so rows of up to kDirectChunks chunks keep the direct one.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace darkformer::causal_ops {

// Rows of at most this many chunks take the direct form (N x N decays).
inline constexpr int64_t kDirectChunks = 64;

// The chunks of a block for a row of `chunks`: 0 for the direct form, else ceil(sqrt(chunks)).
int64_t DecayBlockChunks(int64_t chunks);
// Floats of decays per feature and key row that the form for `chunks` holds (the memory estimate's).
int64_t DecayFloatsPerFeature(int64_t chunks);

struct ChunkDecays {
  int64_t chunks = 0, block = 0;  // N; b (0: direct)
  torch::Tensor dec_BRMNN;        // direct: exp(R(e_c') - R(e_{c-1})) for c' < c, 0 elsewhere
  // Blocked: R(e_c) padded (the padding chunks repeat the last) to nb blocks of b, and within each
  // block exp(R(e_c') - R(e_c)) for c' <= c, 0 elsewhere.
  torch::Tensor end_BRMKB, local_BRMKBB;
  torch::Tensor doc_B1KB;  // blocked, with documents: the document of e_c, padded alike
};

// end_BRMN: R(e_c) per feature and chunk, at any strides; end_doc_B1N: the document of e_c
// (undefined: one per row). block: b (0: the direct form), by default DecayBlockChunks(N).
ChunkDecays MakeChunkDecays(const torch::Tensor& end_BRMN, const torch::Tensor& end_doc_B1N);
ChunkDecays MakeChunkDecays(const torch::Tensor& end_BRMN, const torch::Tensor& end_doc_B1N, int64_t block);

// S_c from u_BRMNV (U_c relative to R(e_c)), chunk-major: B x R x N x M x V, contiguous.
torch::Tensor EnteringStates(const ChunkDecays& d, const torch::Tensor& u_BRMNV);
// Z_c from t_BRMNV (T_c), chunk-major: B x R x N x M x V, contiguous.
torch::Tensor ReverseStates(const ChunkDecays& d, const torch::Tensor& t_BRMNV);

}  // namespace darkformer::causal_ops
