// op: cuda's launches (cuda_op.cpp): how a call is cut into chunks and blocks, the scan's Launch
// over the call's tensors, its buffers, and the features it reads (the key rows' computed here,
// the queries' given or projected inside the scan, cuda_scan_queries.h).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "attention/ops/cuda_scan_launch.h"
#include "attention/ops/feature_map.h"

namespace darkformer::cuda_op_launch {

// How a call is cut (chunk: the kernel's chunk_size, in positions): sub-chunks of S, and chunks of
// chunk / S of them, in the forward and the backward alike. The states entering the
// chunks are not kept for the backward, which recomputes them (the forward's first two steps), so
// autograd holds O(L D) whatever m and chunk, and short rows still spread over many blocks (2k
// positions at chunk 64: 32 blocks per row, not the 8 of a checkpoint every ceil(m / S) = 32
// sub-chunks at m = 256). Their cost: while a call runs it holds m (Dv + 1) floats per chunk (the
// chunks' own states, merged in place into the entering ones).
struct Chunking {
  int64_t sub, chunk_subs;
};
Chunking ChunkingFor(int64_t chunk);

// The scan's Launch for `heads` query heads per sequence, base-2 key features l (B x R x L x m) and
// v (B x K x L x Dv), with the document ids (B x L; undefined: none) that the kernels read on the
// device: `ids` holds them there as int64 and must outlive the launch, as must `resets` (one float
// per chunk). The queries are the caller's to point to (PointQueries).
cuda_scan::Launch MakeLaunch(int64_t heads, const torch::Tensor& l, const torch::Tensor& v, int64_t sub,
                             int64_t group_subs, const torch::Tensor& document_ids_BL, torch::Tensor& ids,
                             torch::Tensor& resets);

// W blocks per row for the backward (each takes every W-th chunk of its row): as many as run at
// once on `on`'s device, and no more than keep the backward's scratch within 256 MiB.
int64_t BackwardBlocks(const cuda_scan::Launch& x, const torch::Tensor& on);

// The forward's blocks are chunks, or (row, slice of features) in its scan over chunks; the
// backward's (row, w) for w < W: a scratch of ScratchFloats each.
torch::Tensor Scratch(const cuda_scan::Launch& x, bool backward, const torch::TensorOptions& options);

// A state per chunk of the call: chunk_count x m x (Dv + 1) (or x m, `with_values` false).
torch::Tensor PerChunk(const cuda_scan::Launch& x, bool with_values, const torch::TensorOptions& options);

// The buffers of the forward's first two steps (the forward, the prefill, and the backward which
// reruns them), pointed to by `x`: the entering states and the steps' scratch.
struct ForwardBuffers {
  torch::Tensor states, refs, scratch;
  ForwardBuffers(cuda_scan::Launch& x, const torch::TensorOptions& options);
};

// Base-2 log-features of the key rows of y (as given: their fp32 copies and mapped inputs are freed
// on return), contiguous, no autograd.
torch::Tensor KeyFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& y,
                          int64_t rows);

// The scan's queries (cuda_scan_queries.h): projected inside from x as given (fp32 or bf16) for
// positive features whose W takes no gradient, with P = log2(e) A W^T (N x D x m, N = H where A is
// per query head) or log2(e) s W^T (1 x D x m) and W (m x R); else their base-2 log-features a
// (B x H x L x m), computed here (any other map; LFK, whose W learns; fp16 queries). No autograd.
struct QuerySide {
  torch::Tensor a, x, proj, w;
  bool Inside() const { return !a.defined(); }
};
QuerySide MakeQuerySide(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x);
void PointQueries(cuda_scan::Launch& launch, const QuerySide& q);

}  // namespace darkformer::cuda_op_launch
