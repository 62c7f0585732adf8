// op: cuda, the CUDA operator (issue 53): the log-features projected inside the scan from the
// inputs as given where the map is positive, the keys' always (cuda_scan_keys.h), the queries'
// where W takes no gradient (performer, darkformer; LFK's from the map: cuda_scan_queries.h), and
// from the map (LibTorch ops) for every other map and fp16 inputs; then the scan of cuda_scan.h
// over every key row and chunk at once: the forward in three launches (the chunks' own states, a
// short scan over chunks per row, the chunks' outputs), the backward in a query side and a key side
// (cuda_scan_backward_body.h), with the per-feature stabiliser inside (normaliser >= 1 at any
// scale; no guard, no host sync). fp32 state and sums; the
// matrix products on tensor cores when the queries arrived in bf16 or fp16 (or fp32 where LibTorch
// allows TF32), in 3xTF32 for the projections and bf16x3 for the rest, else fp32 on CUDA cores
// (cuda_scan_matmul.h). Deterministic (fixed orders,
// no atomics). GQA: key features once per KV head, or per query head where the map's parameters are
// (darkformer's per-head M). The map's own input map (FeatureMap::input_map, input_scale) is applied
// here, so autograd saves q, k and v as given and the normaliser: O(L D), nothing copied; the
// backward recomputes the features, the states entering the chunks (the forward's first two
// launches) and the fp32 output (as FlashAttention recomputes its scores; bf16's would not do:
// g . out cancels on sharp rows).
// Not yet: operands resident in shared memory across a sub-chunk's steps (the scan's scratch is
// global memory; each product stages its operands in panels, cuda_scan_matmul.h).
#pragma once

#include <torch/torch.h>

#include "attention/ops/feature_map.h"

namespace darkformer {

// out_BHLD as FusedCausalLinearAttention's (causal_function.h), on a CUDA device, from the inputs
// as given (fp32 or 16-bit; computed in fp32), in bf16 where v is (rounded as LibTorch rounds),
// else fp32. Refused on other devices, for fp64 inputs and in a
// build without the CUDA kernels.
// With document_ids_BL (document_mask.h) every running quantity restarts where a row's id changes,
// as if each document ran alone. The kernels read the ids on the device, so a call never waits
// for the host; that is also why increasing ids are not checked here, as the CPU forms check them
// (DocumentSpans): a change of id, either way, starts a document.
torch::Tensor CudaCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                  const FeatureMap& map, int64_t chunk_size, const torch::Tensor& document_ids_BL = {});

// A prefill by the same scan (keys and values only): the state the recurrent step continues from
// (recurrent_step.h), as {state_BKFMV, ref_BKFM}; LinearAttentionPrefillState takes it for op: cuda.
std::pair<torch::Tensor, torch::Tensor> CudaPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                          const FeatureMap& map, int64_t num_query_heads,
                                                          int64_t chunk_size);

// Bytes the operator's autograd node holds for its backward; 0 when `out` is not its output.
int64_t CudaOpSavedBytes(const torch::Tensor& out);

// Whether this build has the CUDA kernels (CMake found nvcc).
bool CudaOpBuilt();

// Tests: true runs the same scan emulated on the host for CPU inputs (cuda_scan_host.cpp), so the
// CPU suite checks the device's arithmetic; op: cuda is refused on a CPU otherwise.
void EmulateCudaOpOnHostForTesting(bool emulate);
// Tests: as if `blocks` blocks of the per-chunk kernels ran at once on the device (0: the device's
// own count; the host emulation then has no limit). 1 gives the forward one block that takes every
// chunk in turn, and the backward one per row.
void LimitCudaOpBlocksForTesting(int64_t blocks);
// Tests: false keeps every block's scratch in global memory even where the device's shared memory
// holds it (true, the default: Launch::scratch_shared). The host emulation's is always global.
void AllowCudaOpSharedScratchForTesting(bool allowed);

}  // namespace darkformer
