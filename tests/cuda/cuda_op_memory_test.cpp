// What op: cuda holds, per position, counted by LibTorch's allocator (util/peak_memory.h) over a
// bf16 forward + backward of performer (keys once per KV head) and darkformer (M per query head:
// keys per query head) at two lengths: the difference divided by the added positions leaves out
// whatever does not grow with L. On the CPU the scan runs emulated on the host, which allocates
// the device's tensors in the same order (its scratch is larger: a block per chunk).
//   - From forward to backward (what a training step keeps per layer): the inputs as given, the
//     output (bf16, as v) and the fp32 normaliser; nothing else (no fp32 output: the backward
//     recomputes it; no fp32 copy of the inputs, no keys or values per query head, no per-chunk
//     buffer).
//   - At the peak (the backward's query side), at most that plus its working set (the values and
//     the incoming gradient read where they lie): g . out per query, the key features' gradients,
//     the queries' gradient at their mapped input (the scan projects both sides' features itself:
//     no L x m tensor of them), and per chunk one state (the entering and the reverse states are
//     never held at once) and the scratch.
//   - The memory estimate's shadow of the same call (train/memory_estimate.h, fit-check) saves
//     what the operator keeps and allows its working set.
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_scan.h"
#include "attention/ops/sub_chunk.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"
#include "util/mixed_precision.h"
#include "util/peak_memory.h"
#include "util/shadow_tape.h"

namespace darkformer {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 1, kDim = 16, kFeatures = 32, kChunk = 16;

struct Bytes {
  int64_t held = 0, peak = 0;     // measured
  int64_t saved = 0, working = 0;  // the shadow's: saved for the backward, and the backward's widest extra
};

AttentionKernel Make(const std::string& name) {
  KernelShape shape{kHeads, kDim};
  const std::string yaml = "{num_features: " + std::to_string(kFeatures) + ", chunk_size: " + std::to_string(kChunk) +
                           ", op: cuda}";
  return MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
}

// The shadow of a bf16 call on a GPU run (q, k and v are Linear outputs under autocast).
void ShadowOf(AttentionKernel& kernel, int64_t length, Bytes& bytes) {
  shadow::Tape tape(/*bf16=*/true);
  ShadowAttentionCall call;
  call.length = length;
  call.heads = kHeads;
  call.key_heads = kKvHeads;
  call.head_dim = kDim;
  call.cpu = false;
  const auto q = tape.New(length * kHeads * kDim, shadow::kBf16, true);
  const auto k = tape.New(length * kKvHeads * kDim, shadow::kBf16, true);
  const auto v = tape.New(length * kKvHeads * kDim, shadow::kBf16, true);
  bytes.working = kernel->ShadowForward(tape, call, q, k, v).backward_bytes;
  bytes.saved = tape.SavedBytes();
}

// One bf16 forward + backward under autocast, as a user's step runs it.
Bytes Measure(const std::string& name, int64_t length, torch::Device device) {
  auto kernel = Make(name);
  kernel->to(device);
  torch::manual_seed(3);
  auto info = std::make_shared<PeakMemory>(device.type());
  Bytes bytes;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    const auto options = torch::TensorOptions().device(device);
    auto q = torch::randn({1, kHeads, length, kDim}, options).to(torch::kBFloat16).requires_grad_();
    auto k = torch::randn({1, kKvHeads, length, kDim}, options).to(torch::kBFloat16).requires_grad_();
    auto v = torch::randn({1, kKvHeads, length, kDim}, options).to(torch::kBFloat16).requires_grad_();
    AttentionCall call;
    call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
    torch::Tensor out;
    {
      AutocastScope autocast(device.type(), true);
      out = kernel->forward(q, k, v, call);
    }
    bytes.held = info->current();
    out.sum().backward();
    bytes.peak = info->peak();
  }
  ShadowOf(kernel, length, bytes);
  return bytes;
}

TEST(CudaOpMemoryTest, HeldAndPeakBytesPerPosition) {
  const auto device = testing::TestDevice();
  const int64_t length = 256;
  for (const std::string name : {"performer", "darkformer"}) {
    const int64_t rows = name == "darkformer" ? kHeads : kKvHeads;  // key rows: per query head under M
    const Bytes at_l = Measure(name, length, device), at_2l = Measure(name, 2 * length, device);
    const double held = static_cast<double>(at_2l.held - at_l.held) / length;
    const double peak = static_cast<double>(at_2l.peak - at_l.peak) / length;
    const int64_t h = kHeads, kv = kKvHeads, d = kDim, m = kFeatures, dv = kDim;
    // bf16: the inputs as given and the output; fp32: the normaliser (the backward recomputes the
    // fp32 output).
    const double kept = 2.0 * (h * d + 2 * kv * d) + 2.0 * h * dv + 4.0 * h;
    // The backward's working set, in fp32 (the values and the incoming gradient are read as they
    // come: here sum()'s broadcast, no bytes): g . out per query and head, the key features'
    // gradients and one norm per key and row (the scan projects the features themselves), the
    // queries' gradient at their mapped input (width d: both maps keep it);
    // per chunk and row, one state of m (Dv + 1) floats, its m references and its reset flag, and
    // the host emulation's scratch (a block per chunk and row; the device's is capped).
    cuda_scan::Launch launch;
    launch.features = m;
    launch.value_dim = dv;
    launch.group = h / rows;
    launch.sub = causal_ops::SubChunk(kChunk);
    launch.group_subs = kChunk / launch.sub;
    const double per_chunk = 4.0 * rows * (m * (dv + 1) + m + 1 + launch.ScratchFloats(/*backward=*/true));
    const double working = 4.0 * (h + h * d + rows * (m + 1) + rows * dv) + per_chunk / kChunk;
    // CUDA's caching allocator reports each block rounded up to 512 bytes: at most that per
    // tensor alive (about 20 at the peak), a few bytes per position at these lengths.
    const double rounding = device.is_cuda() ? 24.0 * 512 / length : 0.0;
    std::cout << "[cuda op bytes per position] " << name << ": held " << held << " (kept " << kept << "), peak "
              << peak << " (bound " << kept + working << ")\n";
    EXPECT_LE(held, kept + rounding) << name;
    EXPECT_LE(peak, kept + working + rounding) << name;
    // The shadow saves the inputs as given and the normaliser (the output is the layer's to keep,
    // not the operator's), and its backward's widest extra covers what the peak adds to what is
    // held.
    const double shadow_saved = static_cast<double>(at_2l.saved - at_l.saved) / length;
    const double shadow_working = static_cast<double>(at_2l.working - at_l.working) / length;
    std::cout << "[cuda op bytes per position] " << name << " shadow: saved " << shadow_saved << ", working "
              << shadow_working << "\n";
    EXPECT_EQ(shadow_saved, kept - 2.0 * h * dv) << name;
    EXPECT_GE(shadow_working + rounding, peak - held) << name;
  }
}

}  // namespace
}  // namespace darkformer
