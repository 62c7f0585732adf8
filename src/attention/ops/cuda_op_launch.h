// op: cuda's launches (cuda_op.cpp): how a call is cut into chunks and blocks, the scan's Launch
// over the call's tensors, its buffers, and the features it reads (given, or projected inside the
// scan: cuda_scan_queries.h, cuda_scan_keys.h).
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
// sub-chunks at m = 256). Their cost: while a call runs it holds m (Dv + 1) floats per chunk of a
// segment (SegmentChunks: the chunks' own states, merged in place into the entering ones, then the
// reverse states in the same buffer), and the backward one per segment.
struct Chunking {
  int64_t sub, chunk_subs;
};
// S is the largest divisor of the chunk up to `longest_sub` (the kernel's sub_chunk; 0: causal_ops::kMaxSubChunk).
Chunking ChunkingFor(int64_t chunk, int64_t longest_sub);

// What a launch is made for: a prefill takes its rows whole; the forward and the backward walk
// them in segments (SegmentChunks).
enum class Pass { kPrefill, kForward, kBackward };

// The scan's Launch for `heads` query heads and `rows` key rows per sequence, m features, and v
// (B x K x L x Dv, fp32 or bf16, read as given at its strides), with the document ids (B x L; undefined: none) that the
// kernels read on the device: `ids` holds them there as int64 and must outlive the launch, as must
// `resets` (one float per chunk of a segment). The features are the caller's to point to (PointFeatures).
// segment_chunks: the kernel's key (0: SegmentChunks, made even: EvenSegment); a prefill takes whole rows.
cuda_scan::Launch MakeLaunch(int64_t heads, int64_t rows, int64_t features, const torch::Tensor& v, int64_t sub,
                             int64_t group_subs, const torch::Tensor& document_ids_BL, torch::Tensor& ids,
                             torch::Tensor& resets, Pass pass, int64_t segment_chunks = 0);

// The chunks of a segment (Launch::segment_chunks) for `rows` key rows on `on`'s device: as many per
// row as the pass's per-chunk blocks that run at once cover, so a segment's launches still fill the
// device, while the states a call holds (two per chunk of a segment, and one per segment: Carry)
// stay bounded by the segment, not the row: darkformer's 8 key rows at chunk 64 hold 17 chunks' on
// an H200 (132 resident blocks), not 32 at 2k and 512 at 32k. The host emulation runs whole rows
// (no limit) unless a test sets one (LimitCudaOpBlocksForTesting).
int64_t SegmentChunks(int64_t rows, const torch::Tensor& on, bool backward);

// The segment a row of `chunks` chunks is walked in, at most `most` long: as few segments as that
// allows, as even as they can be (32 chunks at most 17: two of 16, not 17 and 15), so as many
// launches at one state per row fewer. The default's (MakeLaunch, the memory estimate's shadow).
int64_t EvenSegment(int64_t most, int64_t chunks);

// The same for the backward of a call on this process's current CUDA device (the memory
// estimate's, which has no tensor): 0 where there is none to ask (a CPU-only process, a build
// without the kernels), whose estimate then counts whole rows, an upper bound.
int64_t SegmentChunksHere(int64_t rows);

// A buffer the kernels write before they read it: torch::empty on a device; on the host, where the
// tests run the emulation, every element NaN (bf16's too), so one read before it is written, or a
// result never written, shows in what the call returns rather than reading what the allocator held.
torch::Tensor Unwritten(at::IntArrayRef sizes, const torch::TensorOptions& options);

// W blocks per row for the backward (each takes every W-th chunk of its row's segment): as many as
// run at once on `on`'s device, and, where their scratch lives in global memory, no more than keep
// it within 256 MiB.
int64_t BackwardBlocks(const cuda_scan::Launch& x, const torch::Tensor& on);

// The forward's blocks are chunks, or (row, slice of features) in its scan over chunks; the
// backward's (row, w) for w < W, and its reruns of the forward's steps the forward's blocks: a
// scratch of ScratchFloats each, one buffer for the backward's both. On a CUDA device whose blocks
// hold it in shared memory (cuda_scan::ScratchFitsInSharedMemory) the blocks carve it there
// (x.scratch_shared) and the buffer holds none of it; x.scratch points to the buffer. Sets both.
torch::Tensor Scratch(cuda_scan::Launch& x, bool backward, const torch::TensorOptions& options);

// A state per chunk of a segment and one past it, per row: rows x (Segment() + 1) x m x (Dv + 1)
// (or x m, `with_values` false).
torch::Tensor PerSegment(const cuda_scan::Launch& x, bool with_values, const torch::TensorOptions& options);

// The states carried between a row's segments (Launch::carry_states): rows x slots x m x (Dv + 1)
// and rows x slots x m, pointed to by `x`.
struct Carries {
  torch::Tensor states, refs;
  Carries(cuda_scan::Launch& x, int64_t slots, const torch::TensorOptions& options);
};

// Moves `x` to segment `segment` of its rows, entering from carry slot `enter` (-1: the row's first
// segment, the empty state) and leaving the state after it in slot `leave` (-1: nowhere).
void EnterSegment(cuda_scan::Launch& x, int64_t segment, int64_t enter, int64_t leave);

// The buffers of the forward's first two steps (the forward and the prefill), pointed to by `x`:
// the entering states, the scratch, and one carry slot per row (the state after a segment, which
// enters the next: both slots of every EnterSegment but the first's).
struct ForwardBuffers {
  torch::Tensor states, refs, scratch;
  Carries carry;
  ForwardBuffers(cuda_scan::Launch& x, const torch::TensorOptions& options);
};

// The features the scan reads, no autograd. Positive features of fp32 or bf16 inputs are projected
// inside, from the inputs as given, by P = log2(e) A W^T (N x D x m, N = H where A is per query
// head) or log2(e) s W^T (1 x D x m):
// - the queries where W takes no gradient (cuda_scan_queries.h; their backward reads W, m x R);
// - the keys always (cuda_scan_keys.h: the scan gives their d log phi either way, so LFK's W
//   learns as before), with n = log2(e) |y'|^2 / 2 per key row and position (B x R x L).
// Else the base-2 log-features a (B x H x L x m) and l (B x R x L x m), computed here (any other
// map; LFK's queries; fp16 inputs; both sides under the kernel's precompute_features): their fp32
// copies and mapped inputs are freed on return.
struct ScanFeatures {
  torch::Tensor a, x;         // the queries' features, or the queries as given
  torch::Tensor l, y, norms;  // the key rows' features, or the keys as given and n
  torch::Tensor proj, w;
  bool QueriesInside() const { return !a.defined(); }
  bool KeysInside() const { return !l.defined(); }
};
ScanFeatures MakeScanFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                              const torch::Tensor& y, int64_t rows);
void PointFeatures(cuda_scan::Launch& launch, const ScanFeatures& f);

}  // namespace darkformer::cuda_op_launch
