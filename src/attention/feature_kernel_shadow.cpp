// The shadow of random-feature attention's forward (see feature_kernel_base.h): what it saves for
// the backward, replayed on sizes for the memory estimate. Features, running sums and the
// normaliser are fp32 whatever autocast does (log_feature_kernel.cpp, signed_feature_kernel.cpp).
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "attention/feature_kernel_base.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/causal_form.h"
#include "attention/ops/chunk_parallel.h"
#include "attention/ops/cuda_op_launch.h"
#include "attention/ops/cuda_scan_launch.h"
#include "attention/ops/raw_cpu_kernel.h"

namespace darkformer {

using shadow::kF32;
using shadow::Shadow;

ShadowAttention ShadowFeatureAttention(shadow::Tape& tape, const ShadowAttentionCall& c, const Shadow& q,
                                       const Shadow& key, const Shadow& v, const FeatureShadowForm& form,
                                       const FeatureKernelOptions& options, bool parameters_train) {
  const int64_t B = c.batch, L = c.length, T = B * L, H = c.heads, K = c.key_heads, D = c.head_dim;
  const bool rg = q.rg || key.rg || v.rg || parameters_train;
  // The raw kernel takes positive features in fp32 on a CPU (the training path's case).
  const bool raw_runs = c.cpu && form.positive;
  const auto resolved = ResolveCausalForm(options.op, c.cpu, raw_runs, c.documents);
  const int64_t chunk = std::max<int64_t>(1, std::min(options.chunk_size, L));
  if (form.causal_operator && form.positive && resolved == CausalForm::kCuda) {
    // The CUDA operator (ops/cuda_op.h) maps the inputs itself: it saves q, k and v as given and
    // the normaliser, and gives its output in v's dtype (the backward recomputes it in fp32). Its
    // backward's working set (cuda_op_memory_test.cpp; it reads the values and the incoming
    // gradient as they come, no copy): g . out per query and head, the key features' gradients in
    // fp32 (the scan projects the features themselves, with one norm per key:
    // ops/cuda_scan_keys.h), dv per key row or, where the rows add theirs into one per KV head
    // (cuda_scan::DvShared: darkformer's, unless train.deterministic), per KV head, the queries'
    // gradient at their mapped input (width R; where W trains, their features and their gradients,
    // ops/cuda_scan_queries.h), and per chunk of a segment and key row one state of m (D + 1)
    // floats with its references (the chunk's and its sub-chunks') and, at most, a block's scratch,
    // one more state past them, and per later segment the state entering it and the reverse state
    // passed back (cuda_op.cpp's ScanBackward), and the features' projection P (D x m per head of
    // the input map, or one: ops/cuda_op_launch.h's ScanFeatures). A segment's chunks: the
    // kernel's segment_chunks, or as many as this process's device runs at once, made even
    // (cuda_op_launch::SegmentChunksHere, EvenSegment), or, with no device to ask, the whole row:
    // an upper bound. (A 16-bit input is bf16 here: autocast's.)
    const int64_t m = form.features, rows = form.map_heads > 1 ? H : K, chunks = (L + chunk - 1) / chunk;
    const int64_t dv_rows = cuda_scan::DvShared(rows / K, c.deterministic) ? K : rows;
    // The kernel's precompute_features gives both sides' log-features before the scan, held
    // through it beside their gradients: as for the queries where W trains.
    const bool given = options.precompute_features;
    const int64_t queries = form.projection_trains || given ? 2 * m : (form.rank > 0 ? form.rank : D);
    const int64_t keys = given ? 2 * m : m + 1;
    const auto cut = cuda_op_launch::ChunkingFor(chunk, options.sub_chunk);
    const int64_t scratch = cuda_scan::Scratch::Floats(m, D, H / rows, cut.sub, true);
    if (rg) {
      for (const auto& given : {q, key, v}) tape.Save(given);
      tape.Save(tape.New(T * H, kF32, true));  // normaliser
    }
    ShadowAttention r;
    r.out = tape.New(T * H * D, v.esz == shadow::kBf16 ? shadow::kBf16 : kF32, rg);
    const int64_t here = cuda_op_launch::SegmentChunksHere(B * rows);
    const int64_t asked = options.segment_chunks > 0 ? options.segment_chunks
                          : here > 0                 ? cuda_op_launch::EvenSegment(here, chunks)
                                                     : 0;
    const int64_t held = asked > 0 && asked < chunks ? asked : chunks;  // Launch::Segment()
    const int64_t segments = (chunks + held - 1) / held, state = m * (D + 1) + m;
    const int64_t per_row = held * (state + 1 + cut.chunk_subs * m + scratch) + state +
                            (segments - 1) * state + (segments > 1 ? m * (D + 1) : 0);
    const int64_t projection = given ? 0 : std::max<int64_t>(form.map_heads, 1) * D * m;
    r.backward_bytes =
        (T * H + T * H * queries + T * rows * keys + T * dv_rows * D + B * rows * per_row + projection) * kF32;
    return r;
  }
  const bool mapped = form.positive && form.map_heads > 0;
  const int64_t width = mapped && form.rank > 0 ? form.rank : D;
  Shadow x, y, vf = tape.To(v, kF32);
  int64_t key_heads = K;  // heads of the operator's keys: K, or H with per-head parameters
  if (mapped) {
    // x = q (sqrt(s) M)^T as one product: q (or its contiguous copy) saved for M's gradient.
    const Shadow qf = tape.New(q.numel, kF32, q.rg);
    if (parameters_train) tape.Save(qf);
    x = tape.New(T * H * width, kF32, rg);
    Shadow yf = tape.To(key, kF32);
    if (form.map_heads > 1 && K < H) {
      key_heads = H;
      yf = tape.New(T * H * D, kF32, key.rg);
      vf = tape.New(T * H * D, kF32, v.rg);
    } else if (K > 1) {
      yf = tape.New(yf.numel, kF32, yf.rg);  // the product's contiguous copy of k's transposed layout
    }
    if (parameters_train) tape.Save(yf);
    y = tape.New(T * key_heads * width, kF32, rg);
    // The batched products broadcast (sqrt(s) M)^T to B x heads copies, saved for the inputs' gradients.
    if (qf.rg) tape.Save(tape.New(B * H * D * width, kF32, true));
    if (yf.rg) tape.Save(tape.New(B * key_heads * D * width, kF32, true));
  } else {
    x = tape.New(T * H * D, kF32, rg);  // q.to(f32) * sqrt(s): new, contiguous after folding
    y = tape.New(T * K * D, kF32, rg);
  }
  if (K > 1 && key_heads == K) vf = tape.New(vf.numel, kF32, vf.rg);  // folding copies v's layout
  const Shadow out = tape.New(T * H * D, kF32, rg);
  if (rg) {
    tape.Save(x);
    tape.Save(y);
    tape.Save(vf);
    tape.Save(out);
    tape.Save(tape.New(T * H, kF32, true));  // normaliser
    if (c.cpu && form.positive) {  // the raw CPU kernel's checkpoints: state and per-feature reference
      const int64_t count = CheckpointCount(L, form.features, chunk);
      tape.Save(tape.New(B * key_heads * count * form.features * (D + 2), kF32, true));
    }
  }
  ShadowAttention r;
  r.out = tape.To(out, v.esz);
  r.backward_bytes = 4 * T * H * D * kF32;
  if (form.causal_operator && resolved == CausalForm::kCuda) {
    // The CUDA operator on another log-form map (x, y, v in fp32 as above): its backward's working
    // set as for positive features, per chunk one state, its references and at most a block's scratch.
    const int64_t m = form.features, chunks = (L + chunk - 1) / chunk;
    const auto cut = cuda_op_launch::ChunkingFor(chunk, options.sub_chunk);
    const int64_t scratch = cuda_scan::Scratch::Floats(m, D, H / K, cut.sub, true);
    r.backward_bytes = std::max(r.backward_bytes, (2 * (T * H * m + T * K * m) + T * K * D +
                                                   B * K * chunks *
                                                       (m * (D + 1) + m + 1 + cut.chunk_subs * m + scratch)) *
                                                      kF32);
  }
  if (form.causal_operator && resolved == CausalForm::kChunkParallel) {
    // Its backward's terms, made a slice of key rows at a time (ops/chunk_parallel.h).
    const ChunkParallelDims dims{B, L, H, form.map_heads > 1 ? H : K, form.features, D, chunk};
    const int64_t slice = ChunkParallelSlice(dims, kChunkParallelSliceBytes), rows = B * dims.rows;
    const int64_t working = ChunkParallelWorkingBytes(dims, slice);
    r.backward_bytes = std::max(r.backward_bytes, working);
    if (slice < rows) {
      std::ostringstream note;
      note << std::fixed << std::setprecision(2) << "attention (chunk-parallel form): its terms " << slice
           << (slice == 1 ? " key row of " : " key rows of ") << rows << " at a time, a working set of " << working / 1073741824.0 << " GiB where the whole call's is "
           << ChunkParallelWorkingBytes(dims, rows) / 1073741824.0 << " GiB";
      r.note = note.str();
    }
  }
  return r;
}

bool FeatureKernelBase::ParametersTrain() const {
  for (const auto& p : parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

ShadowAttention FeatureKernelBase::ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const Shadow& q,
                                                 const Shadow& k, const Shadow& v) const {
  FeatureShadowForm form;
  form.features = options_.num_features;
  return ShadowFeatureAttention(tape, call, q, k, v, form, options_, ParametersTrain());
}

ShadowAttention LogFeatureKernel::ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const Shadow& q,
                                                const Shadow& k, const Shadow& v) const {
  if (options_.op == CausalOp::kNaive) return FeatureKernelBase::ShadowForward(tape, call, q, k, v);
  FeatureShadowForm form;
  form.causal_operator = true;
  form.features = options_.num_features;
  if (const auto positive = PositiveForm()) {
    form.positive = true;
    form.features = positive->w_MR.size(0);
    form.projection_trains = positive->w_MR.requires_grad();
    if (positive->input_map_NRD.defined()) {
      form.map_heads = positive->input_map_NRD.size(0);
      form.rank = positive->input_map_NRD.size(1);
    }
  }
  return ShadowFeatureAttention(tape, call, q, k, v, form, options_, ParametersTrain());
}

}  // namespace darkformer
