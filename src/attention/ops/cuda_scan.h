// The CUDA operator's scan (op: cuda) over the key rows of one call (cuda_scan_launch.h describes a
// call, cuda_scan_body.h and cuda_scan_backward_body.h hold its arithmetic): on the device
// (cuda_scan.cu, compiled where CMake finds nvcc) or emulated on the host (cuda_scan_host.cpp), so
// the tests run the device's arithmetic and indexing on a CPU.
#pragma once

#include "attention/ops/cuda_scan_backward_body.h"
#include "attention/ops/cuda_scan_chains.h"
#include "attention/ops/cuda_scan_launch.h"

namespace darkformer::cuda_scan {

// The states entering every chunk of the launch's segment and their references (states, refs),
// from the keys and values alone: the forward's first two steps, which the backward reruns instead
// of saving them; with through_row_end, a prefill for the recurrent step (recurrent_step.h): the
// state after the whole row in its last slot. Needs resets and the forward's scratch.
void StatesOnHost(const Launch& launch);
void ForwardOnHost(const Launch& launch);
// The backward in two parts, so the caller frees the states entering the chunks between them: the
// query side (da, and the first terms of dl and dv; consumes states, needs refs), then the key
// side (the reverse states in z, and the rest of dl and dv; needs refs).
void QuerySideOnHost(const Launch& launch);
void KeySideOnHost(const Launch& launch);

// Whether this build compiled the device kernels (CMake found nvcc: DARKFORMER_CUDA_OP).
bool DeviceKernelsBuilt();
// How many blocks of the per-chunk kernels (the backward's, or the forward's) run at once on the
// current CUDA device: its SMs times the kernel's occupancy. More blocks add no parallelism, only
// scratch: the launches give each block several chunks in turn instead.
int64_t ResidentBlocks(bool backward);
// Whether a block of the per-chunk kernels on the current CUDA device holds `floats` of scratch
// (Launch::ScratchFloats) in its shared memory beside the products' panels (kMatMulFloats): the
// device's opt-in limit per block. False where the kernels are not built.
bool ScratchFitsInSharedMemory(int64_t floats);
// On `stream` (a cudaStream_t), asynchronously; they throw where the kernels are not built.
void StatesOnDevice(const Launch& launch, void* stream);
void ForwardOnDevice(const Launch& launch, void* stream);
void QuerySideOnDevice(const Launch& launch, void* stream);
void KeySideOnDevice(const Launch& launch, void* stream);

}  // namespace darkformer::cuda_scan
