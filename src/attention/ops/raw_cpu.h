// The raw CPU form (raw_cpu_kernel.h) inside the operator: which calls it takes, and one unit of
// key rows through it. The forward also writes each row's checkpoints of the key state
// (states_1RS, refs_1RN), which the backward reads.
#pragma once

#include "attention/ops/chunk_loop.h"

namespace darkformer::causal_ops {

// Positive features in fp32 on a CPU whose exp2 loops run vectorised, for `op: auto`; `op: raw_cpu`
// insists (and is refused where it does not apply).
bool CpuKernelApplies(const FeatureMap& map, const torch::Tensor& x);
// The kernel's chunk: at most L (its buffers are sized by it).
int64_t KernelChunk(int64_t chunk_size, int64_t length);
void ForwardUnitRaw(const std::vector<torch::Tensor>& p, const Layout& l, const torch::Tensor& x_1HLD,
                    const torch::Tensor& y_1KLD, const torch::Tensor& v_1KLD, int64_t chunk_size,
                    const torch::Tensor& out_1KGLD, const torch::Tensor& den_1KGL, const torch::Tensor& r_1K1L,
                    const torch::Tensor& states_1RS, const torch::Tensor& refs_1RN);
std::vector<torch::Tensor> BackwardUnitRaw(const std::vector<torch::Tensor>& params, const Layout& l,
                                           const UnitSaved& s, const torch::Tensor& states_1RS,
                                           const torch::Tensor& refs_1RN, int64_t chunk_size,
                                           const torch::Tensor& dx_1HLD, const torch::Tensor& dy_1KLD,
                                           const torch::Tensor& dv_1KLD);

}  // namespace darkformer::causal_ops
