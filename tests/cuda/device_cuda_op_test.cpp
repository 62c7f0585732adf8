// op: cuda (ops/cuda_op.h) on the test device against the chunk loop in fp64 on the CPU (the
// per-feature stabiliser's exact form, itself held to the log-space reference by
// tests/attention/extreme_scale_test.cpp): ordinary rows, sharp opposed rows of norm 60, and a
// running max that jumps by hundreds inside a sub-chunk and at a chunk boundary; MQA (2 query
// heads on 1 KV head), GQA (4 on 2), darkformer's per-head M and packed documents. On the CPU (no DARKFORMER_TEST_DEVICE) the
// scan runs emulated on the host. `SmallCaseForTheSanitizers` is the case tools/gpu_check.sh's
// `sanitize` stage runs under compute-sanitizer's memcheck and racecheck.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_op_device.h"
#include "cuda/cuda_op_cases.h"
#include "cuda/test_device.h"
#include "cuda_op_emulated.h"
#include "util/host_syncs.h"

namespace darkformer {
namespace {

using namespace cuda_op_cases;  // NOLINT: the cases these tests share

// Every path the kernels have, small: fp32 on CUDA cores; bf16 on tensor cores (shared memory)
// with documents read on the device (a sub-chunk's pairs as products before the start at 12, by
// exponentials from it: FactoredQueries), and 2 slices of features over 5 chunks; each block's scratch
// in its shared memory (racecheck reads its hazards there), then in global memory; then the rows
// in segments of 2 chunks (the states carried between them).
// The GPU the tests run on is one this build's kernels run on: the check every op: cuda call makes
// (ops/cuda_op_device.h), which refuses, naming both, a GPU they have no code for.
TEST(DeviceCudaOpTest, TheTestGpuRunsTheBuildsKernels) {
  const auto device = testing::TestDevice();
  if (!device.is_cuda()) GTEST_SKIP() << "no GPU here: the check asks a device";
  EXPECT_EQ(CudaOpDeviceProblem(device.has_index() ? device.index() : 0), "");
}

TEST(DeviceCudaOpTest, SmallCaseForTheSanitizers) {
  ExpectMatches("performer", "ordinary", 0);
  const auto ids = TwoDocuments();
  ExpectMatches("darkformer", "ordinary", 0, ids, /*bf16=*/true, /*chunk=*/8, /*features=*/40);
  {
    const GlobalScratchScope global;
    ExpectMatches("darkformer", "ordinary", 0, ids, /*bf16=*/true, /*chunk=*/8, /*features=*/40);
  }
  const ResidentBlocksScope segments(2 * kHeads);  // darkformer's key rows: one per query head
  ExpectMatches("darkformer", "ordinary", 0, ids, /*bf16=*/true, /*chunk=*/8, /*features=*/40);
}

TEST(DeviceCudaOpTest, OrdinaryRowsWithPerHeadM) { ExpectMatches("darkformer", "ordinary", 0); }

// |log phi| reaches about |x|^2 = 60^2 / sqrt(8) (the scale 1/sqrt(d) splits over q and k).
TEST(DeviceCudaOpTest, SharpOpposedRows) {
  for (const std::string name : {"performer", "darkformer"}) ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0));
}

// Feature 1's max jumps by ~450 inside a sub-chunk, feature 5's at a chunk's first position.
TEST(DeviceCudaOpTest, RunningMaxJumpsInsideASubChunkAndAtAChunkBoundary) {
  for (const std::string name : {"performer", "darkformer"}) ExpectMatches(name, "jump", 900.0);
}

// Packed documents (data.document_masking): a one-token document, boundaries inside a chunk and
// on a chunk's edge (chunk 16); each document scanned alone.
TEST(DeviceCudaOpTest, PackedDocumentsEachAlone) {
  const auto ids = torch::tensor(std::vector<int64_t>{0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                                      3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4})
                       .view({1, kLength});
  for (const std::string name : {"performer", "darkformer"}) ExpectMatches(name, "ordinary", 0, ids);
}

// Documents that start right after a jump (12: inside the sub-chunk [8, 16) that holds key 11),
// with one (32: a chunk's first position, a one-token document) and right after it (33, inside a
// sub-chunk): a later document's features lie ~450 below or above the earlier one's, so a running
// max, a pair, a state or a reverse state carried across a start would be off by 2^450 or
// overflow. The ids live on the test device, where the kernels read them. Then the same with one
// block taking every chunk in turn, and sharp rows with the packed documents above.
TEST(DeviceCudaOpTest, DocumentsStartAroundTheJumps) {
  std::vector<int64_t> ids(kLength, 3);
  for (int64_t t = 0; t < 33; ++t) ids[t] = t < 12 ? 0 : t < 32 ? 1 : 2;
  const auto around = torch::tensor(ids).view({1, kLength});
  for (const std::string name : {"performer", "darkformer"}) ExpectMatches(name, "jump", 900.0, around);
  LimitCudaOpBlocksForTesting(1);
  ExpectMatches("darkformer", "jump", 900.0, around);
  LimitCudaOpBlocksForTesting(0);
  const auto packed = torch::tensor(std::vector<int64_t>{0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                                         3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4})
                          .view({1, kLength});
  ExpectMatches("performer", "sharp", 3600.0 / std::sqrt(8.0), packed);
}

// bf16 inputs (what users train in): the scan's matrix products run on tensor cores, their operands
// split in TF32 or bf16 halves (the host emulation rounds them as the device does), held to the
// bf16 rule at every scale above, documents included.
TEST(DeviceCudaOpTest, TensorCoresHoldTheBf16RuleAtExtremeScale) {
  for (const std::string name : {"performer", "darkformer"}) {
    ExpectMatches(name, "ordinary", 0, {}, /*bf16=*/true);
    ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0), {}, true);
    ExpectMatches(name, "jump", 900.0, {}, true);
  }
  std::vector<int64_t> ids(kLength, 3);
  for (int64_t t = 0; t < 33; ++t) ids[t] = t < 12 ? 0 : t < 32 ? 1 : 2;
  ExpectMatches("darkformer", "jump", 900.0, torch::tensor(ids).view({1, kLength}), true);
}

// Under a training run's TF32 (train.tf32: auto, on for CUDA) every form of the positive kernels
// keeps the bf16 rule at every scale above: the products feeding the features' exponents stay
// fp32-accurate (ops/fp32_products.h), the chunk forms' others run with TF32 off (NoTf32Scope),
// op: cuda's split their operands (3xTF32 or bf16x3, cuda_scan_matmul.h).
TEST(DeviceCudaOpTest, TrainingsTf32KeepsTheBf16RuleAtExtremeScale) {
  const testing::Tf32Scope tf32(true);
  for (const std::string op : {"auto", "chunk_parallel", "chunk_loop", "cuda"}) {
    for (const std::string name : {"performer", "darkformer"}) {
      ExpectMatches(name, "ordinary", 0, {}, /*bf16=*/true, kChunk, kFeatures, op);
      ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0), {}, true, kChunk, kFeatures, op);
      ExpectMatches(name, "jump", 900.0, {}, true, kChunk, kFeatures, op);
    }
  }
}

// Decoding after a prefill by the CUDA operator (its scan's state, recurrent_step.h's layout): the
// prefill's outputs and every step's match the chunk loop's full forward in fp64 on the CPU.
TEST(DeviceCudaOpTest, RecurrentStepsAfterACudaPrefill) {
  const auto device = testing::TestDevice();
  for (const std::string pattern : {"ordinary", "jump"}) {
    const double projection_norm = pattern == "jump" ? 30.0 : 0.0;
    const auto in = MakeInputs(pattern);
    auto reference = Make("darkformer", "chunk_loop", projection_norm);
    const auto ref = RunKernel(reference, in, torch::kCPU, torch::kFloat64);
    auto kernel = Make("darkformer", "cuda", projection_norm);
    kernel->to(device);
    torch::NoGradGuard no_grad;
    AttentionCall call;
    call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
    const auto q = in.q.to(device), k = in.k.to(device), v = in.v.to(device);
    std::unique_ptr<DecodeState> state;
    const int64_t half = 21;  // mid-chunk
    std::vector<torch::Tensor> outs = {kernel->Decode(state, q.narrow(2, 0, half), k.narrow(2, 0, half), v.narrow(2, 0, half), call)};
    for (int64_t t = half; t < kLength; ++t) {
      outs.push_back(kernel->Decode(state, q.narrow(2, t, 1), k.narrow(2, t, 1), v.narrow(2, t, 1), call));
    }
    const auto out = torch::cat(outs, 2).cpu();
    const double tol = std::max(1e-4, 4 * (pattern == "jump" ? 900.0 : 0.0) * std::ldexp(1.0, -24));
    EXPECT_LE(RelativeError(out, ref.out), tol) << pattern << " decode on " << device.str();
  }
}

// Bit-identical from run to run under LibTorch's deterministic algorithms (train.deterministic; issue
// 53: no atomics in sums whose order could change): two calls give the same outputs and gradients
// to the bit, on CUDA cores (fp32) and on tensor cores (bf16 inputs), with documents and several
// feature slices. (Without them darkformer's key rows add dv with atomics, whose order may change
// its last bits: GroupedKeysReadByTheirKvHeadWhereTheyLie.)
TEST(DeviceCudaOpTest, BitIdenticalFromRunToRun) {
  const testing::DeterministicScope deterministic(true);
  const auto device = testing::TestDevice();
  const auto in = MakeInputs("jump");
  const auto ids = TwoDocuments();
  for (const bool bf16 : {false, true}) {
    // A kernel each: the parameters' gradients would otherwise add up over the two backwards.
    auto one = Make("darkformer", "cuda", 30.0, /*chunk=*/8, /*features=*/40);
    auto two = Make("darkformer", "cuda", 30.0, 8, 40);
    const auto first = RunKernel(one, in, device, torch::kFloat32, ids, bf16);
    const auto second = RunKernel(two, in, device, torch::kFloat32, ids, bf16);
    const std::string where = std::string(bf16 ? "bf16" : "fp32") + " on " + device.str();
    ExpectSameBits(first, second, where);
  }
}

// No host sync in a forward + backward of op: cuda, nor of op: auto (the chunk-parallel form on
// CUDA: no guard, no fallback since issue 52), with or without documents (the ids are read on the
// device), counted by LibTorch's profiler (util/host_syncs.h), which does see one in a
// tensor read on the host. A CPU has no host syncs to count.
TEST(DeviceCudaOpTest, NoHostSyncInACall) {
  const auto device = testing::TestDevice();
  if (!device.is_cuda()) GTEST_SKIP() << "host syncs exist on a CUDA device only; the cuda stage counts them";
  const auto in = MakeInputs("ordinary");
  const auto ids = TwoDocuments();
  const auto q0 = in.q.to(device), k0 = in.k.to(device), v0 = in.v.to(device);  // copied before the count
  const auto seen = CountHostSyncs([&] { q0.sum().item<float>(); });
  ASSERT_TRUE(seen.has_value() && *seen >= 1) << "the profiler must see a read on the host";
  // op: cuda, whole rows and in segments of one chunk (its segment_chunks key: the states carried
  // between segments by device copies), with its features precomputed (its precompute_features key:
  // LibTorch's products before each pass), and op: auto, which takes the chunk-parallel form on
  // CUDA (the form training runs).
  struct Case {
    std::string name, op;
    int64_t segment_chunks;
    bool precompute;
  };
  for (const auto& [name, op, segment_chunks, precompute] :
       {Case{"darkformer", "cuda", 0, false}, Case{"darkformer", "cuda", 1, false}, Case{"performer", "cuda", 0, true},
        Case{"darkformer", "auto", 0, false}, Case{"performer", "auto", 0, false}}) {
    auto kernel = Make(name, op, 0, kChunk, kFeatures, kHeads, /*sub_chunk=*/0, segment_chunks, "", precompute);
    kernel->to(device);
    for (const bool documents : {false, true}) {
      AttentionCall call;
      call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
      if (documents) call.document_ids_BL = ids.to(device);
      auto run = [&] {
        auto q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
        kernel->forward(q, k, v, call).sum().backward();
      };
      run();  // warm: the allocator's first blocks, the kernels' first load, the forms' cached masks
      EXPECT_EQ(CountHostSyncs(run).value_or(-1), 0)
          << name << " op: " << op << " segment_chunks " << segment_chunks << (precompute ? " precomputed" : "")
          << (documents ? " with documents" : " without documents");
    }
  }
}

// chunk_size 8: blocks of one sub-chunk each (5 per row, both ways), so every entering state the
// backward recomputes is a chunk boundary; m = 40 also splits the scans over chunks into 2 slices
// of features (32 and 8 at Dv + 1 = 9: Launch::SliceFeatures), one block each.
TEST(DeviceCudaOpTest, OneSubChunkPerBlockAndSeveralFeatureSlices) {
  ExpectMatches("darkformer", "jump", 900.0, {}, false, /*chunk=*/8);
  std::vector<int64_t> ids(kLength, 3);
  for (int64_t t = 0; t < 33; ++t) ids[t] = t < 12 ? 0 : t < 32 ? 1 : 2;
  ExpectMatches("performer", "jump", 900.0, torch::tensor(ids).view({1, kLength}), false, 8);
  ExpectMatches("darkformer", "jump", 900.0, {}, false, 8, /*features=*/40);
  ExpectMatches("performer", "ordinary", 0, torch::tensor(ids).view({1, kLength}), true, 8, 40);
}

// Longer sub-chunks (the sub_chunk key): chunk 32 in sub-chunks of 16 ([0, 16), [16, 32), [32, 40):
// the jump at 11 inside a sub-chunk, the one at 32 a chunk's first, a document starting after
// each); and sub_chunk 32 at chunk 64, which 40 positions cut to one chunk of 40 in sub-chunks of
// 20, the largest divisor up to 32 (both jumps inside one), and sub_chunk 64: the whole row one
// sub-chunk, every pair inside it (the bench's 64:64 cut). fp32, and bf16 on the tensor cores.
TEST(DeviceCudaOpTest, LongerSubChunksAtTheJumpsAndDocuments) {
  std::vector<int64_t> ids(kLength, 3);
  for (int64_t t = 0; t < 33; ++t) ids[t] = t < 12 ? 0 : t < 32 ? 1 : 2;
  const auto around = torch::tensor(ids).view({1, kLength});
  for (const std::string name : {"performer", "darkformer"}) {
    for (const bool bf16 : {false, true}) {
      ExpectMatches(name, "jump", 900.0, {}, bf16, /*chunk=*/32, kFeatures, "cuda", /*sub_chunk=*/16);
      ExpectMatches(name, "jump", 900.0, around, bf16, 32, kFeatures, "cuda", 16);
      ExpectMatches(name, "jump", 900.0, around, bf16, 64, kFeatures, "cuda", 32);
      ExpectMatches(name, "jump", 900.0, around, bf16, 64, kFeatures, "cuda", 64);
    }
    ExpectMatches(name, "sharp", 3600.0 / std::sqrt(8.0), {}, true, 64, kFeatures, "cuda", 32);
  }
}

// The scan reads the queries where they lie (cuda_scan_queries.h): a batch of 2 whose queries are
// a transposed view (B x L x H x D storage, as attention's projections give them) computes the very
// numbers of the same queries made contiguous, fp32 and bf16, with performer's shared projection
// and darkformer's per head (its keys then per query head: each row finds its own head). The
// parameters are frozen: their gradients are LibTorch's products, whose order may follow strides.
// Under deterministic algorithms: darkformer's dv is otherwise added with atomics, in any order.
TEST(DeviceCudaOpTest, QueriesReadWhereTheyLie) {
  const testing::DeterministicScope deterministic(true);
  const auto device = testing::TestDevice();
  torch::manual_seed(8);
  const auto q_BLHD = torch::randn({2, kLength, kHeads, kDim}), k = torch::randn({2, kKvHeads, kLength, kDim});
  const auto v = torch::randn({2, kKvHeads, kLength, kDim}), weights = torch::randn({2, kHeads, kLength, kDim});
  for (const std::string name : {"performer", "darkformer"}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      auto kernel = Make(name, "cuda", 0);
      kernel->to(device);
      for (auto& p : kernel->parameters()) p.requires_grad_(false);
      auto run = [&](bool strided) {
        auto leaf = [&](const torch::Tensor& t) { return t.to(device, dtype).detach().clone().requires_grad_(); };
        auto q = leaf(q_BLHD), kd = leaf(k), vd = leaf(v);
        const auto view = q.transpose(1, 2);
        AttentionCall call;
        call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
        const auto out = kernel->forward(strided ? view : view.contiguous(), kd, vd, call);
        (out.to(torch::kFloat32) * weights.to(device)).sum().backward();
        return std::vector<torch::Tensor>{out.cpu(), q.grad().cpu(), kd.grad().cpu(), vd.grad().cpu()};
      };
      const auto strided = run(true), contiguous = run(false);
      const std::string where = name + (dtype == torch::kBFloat16 ? " bf16" : " fp32") + " on " + device.str();
      ASSERT_FALSE(q_BLHD.transpose(1, 2).is_contiguous());
      for (size_t i = 0; i < strided.size(); ++i) EXPECT_TRUE(torch::equal(strided[i], contiguous[i])) << where << " " << i;
    }
  }
}

// The scan reads keys, values and the incoming gradient where they lie, each key row its own KV
// head's (cuda_scan_keys.h): a batch of 2, 4 query heads on 2 KV heads, keys and values transposed
// views (B x L x K x D storage, as attention's projections give them) and the output's gradient
// one too (the loss reads the output as B x L x H x D, as attention's output projection does),
// performer's keys once per KV head and darkformer's per query head (each row projects its KV
// head's keys by its own head's M, and their backward sums each KV head's rows), fp32 and bf16,
// against the chunk loop in fp64 by the rule of ExpectMatches. Darkformer's rows add their dv into
// their KV head's one buffer (atomics on a device), or under deterministic algorithms each keeps
// its own, summed after: both paths, each sequence's rows into their own KV heads. In whole rows,
// and in segments of one chunk (the batch's rows side by side in each segment's buffers); and with
// the features precomputed (precompute_features: LibTorch's key rows, per KV head or query head).
TEST(DeviceCudaOpTest, GroupedKeysReadByTheirKvHeadWhereTheyLie) {
  const auto device = testing::TestDevice();
  constexpr int64_t heads = 4, kv_heads = 2;
  torch::manual_seed(9);
  const auto q = torch::randn({2, heads, kLength, kDim}), k_BLKD = torch::randn({2, kLength, kv_heads, kDim});
  const auto v_BLKD = torch::randn({2, kLength, kv_heads, kDim});
  // bf16 values (MakeInputs'): a bf16 output's incoming gradient is them exactly.
  const auto weights_BLHD = torch::randn({2, kLength, heads, kDim}).to(torch::kBFloat16).to(torch::kFloat32);
  for (const std::string name : {"performer", "darkformer", "darkformer deterministic"}) {
    const testing::DeterministicScope deterministic(name == "darkformer deterministic");
    for (const bool bf16 : {false, true}) {
      auto run = [&](const std::string& op, torch::Device on, torch::ScalarType compute, bool precompute) {
        auto kernel = Make(name.substr(0, name.find(' ')), op, 0, kChunk, kFeatures, heads, 0, 0, "", precompute);
        kernel->to(on, compute);
        const auto dtype = compute == torch::kFloat64 ? compute : (bf16 ? torch::kBFloat16 : torch::kFloat32);
        auto leaf = [&](const torch::Tensor& t) {
          return (bf16 ? t.to(torch::kBFloat16) : t).to(on, dtype).detach().clone().requires_grad_();
        };
        auto qd = leaf(q), kd = leaf(k_BLKD), vd = leaf(v_BLKD);
        AttentionCall call;
        call.scale = 1.0 / std::sqrt(static_cast<double>(kDim));
        const auto out = kernel->forward(qd, kd.transpose(1, 2), vd.transpose(1, 2), call);
        (out.transpose(1, 2).to(torch::kFloat64) * weights_BLHD.to(on, torch::kFloat64)).sum().backward();
        std::vector<torch::Tensor> r{out.detach().cpu(), qd.grad().cpu(), kd.grad().cpu(), vd.grad().cpu()};
        for (auto& p : kernel->parameters()) r.push_back(p.grad().defined() ? p.grad().cpu() : torch::Tensor());
        return r;
      };
      const auto ref = run("chunk_loop", torch::kCPU, torch::kFloat64, false);
      const int64_t rows = 2 * (name == "performer" ? kv_heads : heads);  // the batch's key rows
      // Whole rows, then segments of one chunk (SegmentChunks); the features projected inside,
      // then precomputed (the key rows' features per KV head or query head alike).
      for (const auto& [per_segment, precompute] : {std::pair<int64_t, bool>{0, false}, {1, false}, {0, true}}) {
        const ResidentBlocksScope blocks(rows * per_segment);
        const auto got = run("cuda", device, torch::kFloat32, precompute);
        const double storage = bf16 ? std::ldexp(1.0, -8) : 0.0;
        const std::string where = name + (bf16 ? " bf16" : " fp32") + " on " + device.str() + ", segments of " +
                                  std::to_string(per_segment) + (precompute ? ", features precomputed" : "");
        ASSERT_EQ(got.size(), ref.size()) << where;
        EXPECT_LE(RelativeError(got[0], ref[0]), std::max(1e-4, storage)) << where << " output";
        for (size_t i = 1; i < got.size(); ++i) {
          if (!ref[i].defined()) continue;
          EXPECT_LE(RelativeError(got[i], ref[i]), std::max(1e-3, i < 4 ? storage : 0.0)) << where << " grad " << i;
        }
      }
    }
  }
}

// As if one block ran at a time: rows walked in segments of one chunk (SegmentChunks), the
// forward's one block taking each segment's chunk of every row in turn, the backward's one per row
// its row's, each reusing its buffers: the same numbers.
TEST(DeviceCudaOpTest, OneBlockTakesEveryChunkInTurn) {
  LimitCudaOpBlocksForTesting(1);
  for (const std::string pattern : {"ordinary", "jump"}) ExpectMatches("darkformer", pattern, pattern == "jump" ? 900.0 : 0);
  LimitCudaOpBlocksForTesting(0);
}

}  // namespace
}  // namespace darkformer
