// Which form of the causal operator a call runs: the one rule behind `op: auto`, asked by the
// operator (causal_function.cpp, raw_cpu.cpp) and by the memory estimate, which must predict the
// form's saved tensors (train/memory_estimate.cpp).
#pragma once

#include "attention/ops/feature_map.h"

namespace darkformer {

enum class CausalForm { kChunkParallel, kRawCpu, kChunkLoop, kCuda };

// A named form is that form (op: raw_cpu is refused where the raw kernel cannot run, in
// CpuKernelApplies; op: cuda off a CUDA device, in cuda_op.cpp). `auto`: the chunk-parallel form
// off the CPU (the CUDA operator takes over once a GPU has checked it: issue 53); on a CPU the raw kernel where it
// runs (positive features, fp32, AVX2), else the chunk loop, or for packed documents
// (data.document_masking) the chunk-parallel form, which masks inside one call where the loop
// would run once per document.
inline CausalForm ResolveCausalForm(CausalOp op, bool on_cpu, bool raw_kernel_runs, bool documents) {
  switch (op) {
    case CausalOp::kChunkParallel: return CausalForm::kChunkParallel;
    case CausalOp::kRawCpu: return CausalForm::kRawCpu;
    case CausalOp::kChunkLoop: return CausalForm::kChunkLoop;
    case CausalOp::kCuda: return CausalForm::kCuda;
    default: break;
  }
  if (!on_cpu) return CausalForm::kChunkParallel;
  if (raw_kernel_runs) return CausalForm::kRawCpu;
  return documents ? CausalForm::kChunkParallel : CausalForm::kChunkLoop;
}

}  // namespace darkformer
