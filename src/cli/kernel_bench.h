// `darkformer kernel-check --bench`: forward+backward time, peak memory and achieved GFLOP/s (model
// FLOPs: three times attention/attention_flops.h's forward; exact's lower triangle) of a
// feature kernel (one form of the causal operator, `--op`, and optionally the naive composite
// path) against exact attention (scaled_dot_product_attention), measured alternately and reported
// as medians, with a JSON line per row (its dtype, SDPA's backend, what our operator computed in). On CUDA (`--device cuda`) every timed call ends with a
// device synchronisation and memory is the CUDA allocator's. `--profile` adds the ops each
// implementation dispatches per attention-layer call, forward and backward (util/op_count.h). How
// one call is made and measured: kernel_bench_call.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace darkformer {

struct KernelBenchOptions {
  std::string kernel = "darkformer";
  std::string options = "{}";                     // the kernel's YAML options, inline
  int64_t batch = 1;                              // sequences per call
  int64_t heads = 8, kv_heads = 0;                // kv_heads 0 = heads (MHA); 1 = MQA
  std::vector<int64_t> lengths = {1024, 4096, 16384};
  std::vector<int64_t> head_dims = {64};
  int64_t repeats = 3;                            // timed repeats per row (median kept), after one warm-up
  std::vector<std::string> ops = {"auto"};         // forms to time: auto | naive | chunk_loop | chunk_parallel | raw_cpu (- or _)
  std::string device = "cpu";                     // cpu | cuda
  // fp32 | bf16: the dtype of q, k, v and of the backward's incoming gradient. bf16 runs each
  // forward under autocast, as a bf16 user's model calls attention: SDPA computes in bf16 (flash
  // on a GPU), our operator as it does under autocast (fp32 features and state).
  std::string dtype = "fp32";
  // auto | true | false, as train.tf32: whether CUDA's fp32 matrix products (SDPA's fp32 kernels,
  // op: cuda's for fp32 inputs; our chunk forms keep fp32) take TF32 operands. auto: on for CUDA,
  // as a training run has it by default, so the bench times what training runs; the CPU has no
  // TF32 (true there is refused).
  std::string tf32 = "auto";
  bool naive = false;                             // also time the naive composite path (op: naive)
  // > 0: sharp, opposed attention (issue 38's fallback cost): queries near one direction, keys near
  // its opposite, every row of x = sqrt(s) q and y = sqrt(s) k of this norm; 0: N(0, 1) entries.
  double norm = 0.0;
  // > 0: also time every implementation on packed windows of documents of this mean length
  // (exponential lengths, seeded), with masking (Attend with document ids), beside the same call
  // without; exact attention also one call per document. 0: off.
  int64_t document_mean = 0;
  int64_t exact_max_length = 16384;               // exact attention is skipped above this length
  std::string json;                               // JSON lines file
  bool profile = false;                           // per-op self time of one run, and ops dispatched per call
};

void RunKernelBench(const KernelBenchOptions& options);

}  // namespace darkformer
