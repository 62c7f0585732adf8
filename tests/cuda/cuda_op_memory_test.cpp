// What op: cuda holds, per position, counted by LibTorch's allocator (util/peak_memory.h) over a
// bf16 forward + backward of performer (keys once per KV head) and darkformer (M per query head:
// keys per query head) at two lengths: the difference divided by the added positions leaves out
// whatever does not grow with L. On the CPU the scan runs emulated on the host, which allocates
// the device's tensors in the same order (its scratch is larger: a block per chunk).
//   - From forward to backward (what a training step keeps per layer): the inputs as given, the
//     output (bf16, as v) and the fp32 normaliser; nothing else (no fp32 output: the backward
//     recomputes it; no fp32 copy of the inputs, no keys or values per query head, no per-chunk
//     buffer).
//   - At the peak, at most that plus the scan's working set in the backward (the values and the
//     incoming gradient read where they lie): g . out per query, the key features' gradients, dv
//     per KV head (per key row under deterministic algorithms), the queries' gradient at their
//     mapped input (the scan projects both sides' features itself: no L x m tensor of them), and
//     per chunk one state (the entering and the reverse states are never held at once) and the
//     scratch. At Gemma 2B's D = m with long chunks the features' backward that follows (the
//     inputs' fp32 copies and gradients, L x D per query head) stays within it too.
//   - The memory estimate's shadow of the same call (train/memory_estimate.h, fit-check) saves
//     what the operator keeps and allows its working set.
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_scan.h"
#include "attention/ops/cuda_op_launch.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"
#include "util/mixed_precision.h"
#include "util/peak_memory.h"
#include "util/shadow_tape.h"

namespace darkformer {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 1;

// The head width D, the features m and the chunk: m > D with short chunks (the scan's states
// dominate), or Gemma 2B's D = m with long chunks, where the features' backward (L x D per query
// head: the inputs' fp32 copies and their gradients) must stay within the scan's working set;
// and the sub_chunk key (0: the default), whose longer sub-chunks widen a block's scratch; the
// segment_chunks key (0: the default, as many as run at once); and the precompute_features key.
struct Shape {
  int64_t dim, features, chunk, sub_chunk = 0, segment_chunks = 0;
  bool precompute = false;
};

struct Bytes {
  int64_t held = 0, peak = 0;     // measured
  int64_t saved = 0, working = 0;  // the shadow's: saved for the backward, and the backward's widest extra
};

AttentionKernel Make(const std::string& name, const Shape& s) {
  KernelShape shape{kHeads, s.dim};
  const std::string yaml = "{num_features: " + std::to_string(s.features) + ", chunk_size: " + std::to_string(s.chunk) +
                           ", op: cuda, sub_chunk: " + std::to_string(s.sub_chunk) +
                           ", segment_chunks: " + std::to_string(s.segment_chunks) +
                           ", precompute_features: " + (s.precompute ? "true" : "false") + "}";
  return MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
}

// The shadow of a bf16 call on a GPU run (q, k and v are Linear outputs under autocast).
void ShadowOf(AttentionKernel& kernel, int64_t length, int64_t dim, Bytes& bytes) {
  shadow::Tape tape(/*bf16=*/true);
  ShadowAttentionCall call;
  call.length = length;
  call.heads = kHeads;
  call.key_heads = kKvHeads;
  call.head_dim = dim;
  call.cpu = false;
  call.deterministic = at::globalContext().deterministicAlgorithms();
  const auto q = tape.New(length * kHeads * dim, shadow::kBf16, true);
  const auto k = tape.New(length * kKvHeads * dim, shadow::kBf16, true);
  const auto v = tape.New(length * kKvHeads * dim, shadow::kBf16, true);
  bytes.working = kernel->ShadowForward(tape, call, q, k, v).backward_bytes;
  bytes.saved = tape.SavedBytes();
}

// One bf16 forward + backward under autocast, as a user's step runs it.
Bytes Measure(const std::string& name, const Shape& s, int64_t length, torch::Device device) {
  auto kernel = Make(name, s);
  kernel->to(device);
  torch::manual_seed(3);
  auto info = std::make_shared<PeakMemory>(device.type());
  Bytes bytes;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    const auto options = torch::TensorOptions().device(device);
    auto q = torch::randn({1, kHeads, length, s.dim}, options).to(torch::kBFloat16).requires_grad_();
    auto k = torch::randn({1, kKvHeads, length, s.dim}, options).to(torch::kBFloat16).requires_grad_();
    auto v = torch::randn({1, kKvHeads, length, s.dim}, options).to(torch::kBFloat16).requires_grad_();
    AttentionCall call;
    call.scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
    torch::Tensor out;
    {
      AutocastScope autocast(device.type(), true);
      out = kernel->forward(q, k, v, call);
    }
    bytes.held = info->current();
    out.sum().backward();
    bytes.peak = info->peak();
  }
  ShadowOf(kernel, length, s.dim, bytes);
  return bytes;
}

// The shadow's working set, whole, against what a call's peak adds to what it holds but the test's
// own loss (out.sum() and its gradient, two bf16 scalars): on the host to the byte; on CUDA, within
// the caching allocator's rounding (512 bytes for each of about 24 tensors alive).
void ExpectShadowCoversTheCall(const Bytes& at, torch::Device device, const std::string& where) {
  const int64_t loss = 2 * 2, added = at.peak - at.held - loss;
  EXPECT_GE(at.working + (device.is_cuda() ? 24 * 512 : 0), added) << where;
  if (!device.is_cuda()) EXPECT_EQ(at.working, added) << where;
}

// name: "performer", "darkformer", or "darkformer deterministic" (under deterministic algorithms);
// per_segment: the chunks of a row's segment as if rows x per_segment blocks ran at once (0: whole
// rows, the host emulation's own), unless the shape's segment_chunks key gives them.
void ExpectBytesPerPosition(const Shape& shape, const std::string& name, torch::Device device,
                            int64_t per_segment = 0) {
  const int64_t length = 256;
  const bool deterministic = name == "darkformer deterministic";
  const testing::DeterministicScope scope(deterministic);
  const std::string kernel = name.substr(0, name.find(' '));
  const int64_t rows = kernel == "darkformer" ? kHeads : kKvHeads;  // key rows: per query head under M
  // As if rows x per_segment blocks ran at once: segments of per_segment chunks (SegmentChunks).
  const cuda_op_cases::ResidentBlocksScope blocks(rows * per_segment);
  if (shape.segment_chunks > 0) per_segment = shape.segment_chunks;
  const std::string where = name + " at D " + std::to_string(shape.dim) + ", m " + std::to_string(shape.features) +
                            ", chunk " + std::to_string(shape.chunk) + ", sub_chunk " +
                            std::to_string(shape.sub_chunk) + ", segments of " + std::to_string(per_segment) +
                            (shape.segment_chunks > 0 ? " (its key)" : "") +
                            (shape.precompute ? ", features precomputed" : "");
  // dv per KV head, to which its key rows add theirs; per row, summed after, under deterministic
  // algorithms (train.deterministic).
  const int64_t dv_rows = deterministic ? rows : kKvHeads;
  const Bytes at_l = Measure(kernel, shape, length, device), at_2l = Measure(kernel, shape, 2 * length, device);
  const double held = static_cast<double>(at_2l.held - at_l.held) / length;
  const double peak = static_cast<double>(at_2l.peak - at_l.peak) / length;
  const int64_t h = kHeads, kv = kKvHeads, d = shape.dim, m = shape.features, dv = shape.dim;
  // bf16: the inputs as given and the output; fp32: the normaliser (the backward recomputes the
  // fp32 output).
  const double kept = 2.0 * (h * d + 2 * kv * d) + 2.0 * h * dv + 4.0 * h;
  // The scan's working set in its backward, in fp32 (the values and the incoming gradient are read
  // as they come: here sum()'s broadcast, no bytes): g . out per query and head, the key features'
  // gradients and one norm per key and row (the scan projects the features themselves), dv, the
  // queries' gradient at their mapped input (width d: both maps keep it); per chunk and row, one
  // state of m (Dv + 1) floats, its m references and its reset flag, its sub-chunks' m references
  // each (the query side's, for the key side), and the host emulation's scratch (a block per chunk
  // and row; the device's is capped, or in shared memory where it fits). The features' backward after it
  // stays within it. In segments, all of that per chunk is the segment's, whatever L, and what
  // grows with L is one state and its references per segment and row, entering it (the backward's
  // first pass).
  cuda_scan::Launch launch;
  launch.features = m;
  launch.value_dim = dv;
  launch.group = h / rows;
  const auto cut = cuda_op_launch::ChunkingFor(shape.chunk, shape.sub_chunk);
  launch.sub = cut.sub;
  launch.group_subs = cut.chunk_subs;
  const double per_chunk =
      4.0 * rows * (m * (dv + 1) + m + 1 + cut.chunk_subs * m + launch.ScratchFloats(/*backward=*/true));
  // Precomputed (the precompute_features key): both sides' log-features, held through the scan
  // beside their gradients, in place of the queries' gradient at their mapped input and the keys'
  // norms.
  const double per_position = shape.precompute ? 4.0 * (h + 2 * h * m + 2 * rows * m + dv_rows * dv)
                                               : 4.0 * (h + h * d + rows * (m + 1) + dv_rows * dv);
  const double working = per_position + per_chunk / shape.chunk;  // whole rows
  const double peak_working =
      per_segment > 0 ? per_position + 4.0 * rows * (m * (dv + 1) + m) / (per_segment * shape.chunk) : working;
  // CUDA's caching allocator reports each block rounded up to 512 bytes: at most that per
  // tensor alive (about 20 at the peak), a few bytes per position at these lengths.
  const double rounding = device.is_cuda() ? 24.0 * 512 / length : 0.0;
  std::cout << "[cuda op bytes per position] " << where << ": held " << held << " (kept " << kept << "), peak "
            << peak << " (bound " << kept + peak_working << ")\n";
  EXPECT_LE(held, kept + rounding) << where;
  EXPECT_LE(peak, kept + peak_working + rounding) << where;
  // On the host it is the bound to the byte: so the op ran the sub-chunks whose scratch the bound
  // counts, and the segments.
  if (!device.is_cuda()) EXPECT_EQ(peak, kept + peak_working) << where;
  // The shadow saves the inputs as given and the normaliser (the output is the layer's to keep,
  // not the operator's), and its backward's widest extra is the bound's working set, dv's path
  // included, in the segments the operator takes (the key's, or as many chunks as the device runs
  // at once: here the blocks the test allows): so it covers what the peak adds to what is held.
  const double shadow_saved = static_cast<double>(at_2l.saved - at_l.saved) / length;
  const double shadow_working = static_cast<double>(at_2l.working - at_l.working) / length;
  std::cout << "[cuda op bytes per position] " << where << " shadow: saved " << shadow_saved << ", working "
            << shadow_working << "\n";
  EXPECT_EQ(shadow_saved, kept - 2.0 * h * dv) << where;
  EXPECT_EQ(shadow_working, peak_working) << where;
  EXPECT_GE(shadow_working + rounding, peak - held) << where;
  ExpectShadowCoversTheCall(at_l, device, where);
  ExpectShadowCoversTheCall(at_2l, device, where);
}

TEST(CudaOpMemoryTest, HeldAndPeakBytesPerPosition) {
  const auto device = testing::TestDevice();
  for (const Shape shape : {Shape{16, 32, 16}, Shape{32, 32, 64}, Shape{32, 32, 64, 32}}) {
    for (const std::string name : {"performer", "darkformer", "darkformer deterministic"}) {
      ExpectBytesPerPosition(shape, name, device);
    }
  }
}

// With both sides' log-features precomputed (the precompute_features key), the scan holds them and
// their gradients through the backward: m fp32 more per query head and key row than the working
// set above, and what is kept from the forward to the backward is the same.
TEST(CudaOpMemoryTest, PrecomputedFeaturesHeldThroughTheScan) {
  const auto device = testing::TestDevice();
  for (const std::string name : {"performer", "darkformer"}) {
    ExpectBytesPerPosition(Shape{16, 32, 16, 0, 0, true}, name, device);
    ExpectBytesPerPosition(Shape{32, 32, 64, 0, 0, true}, name, device);
  }
}

// In segments of 2 and 4 chunks the states per position fall to one per segment: a half and a
// quarter of whole rows' (which hold one per chunk), the per-chunk scratch and references none;
// segments of 4 given by the kernel's segment_chunks key hold the same.
TEST(CudaOpMemoryTest, InSegmentsOneStatePerSegment) {
  const auto device = testing::TestDevice();
  for (const std::string name : {"performer", "darkformer"}) {
    for (const int64_t per_segment : {2, 4}) ExpectBytesPerPosition(Shape{16, 32, 16}, name, device, per_segment);
    ExpectBytesPerPosition(Shape{16, 32, 16, 0, 4}, name, device);
  }
}

// Where the blocks that run at once do not divide a row (5 chunks' worth per row over 16 and 32
// chunks: even segments of 4 and of 5, EvenSegment), the shadow counts the segments the operator
// takes, whole, at each length.
TEST(CudaOpMemoryTest, ShadowCountsTheSegmentsTaken) {
  const auto device = testing::TestDevice();
  const Shape shape{16, 32, 16};
  for (const std::string name : {"performer", "darkformer"}) {
    const cuda_op_cases::ResidentBlocksScope blocks((name == "darkformer" ? kHeads : kKvHeads) * 5);
    for (const int64_t length : {256, 512}) {
      ExpectShadowCoversTheCall(Measure(name, shape, length, device), device,
                                name + " at L " + std::to_string(length) + ", at most 5 chunks a segment");
    }
  }
}

}  // namespace
}  // namespace darkformer
