// The chunk-parallel form (op: auto on CUDA) on rows long enough that its sums over chunks take
// blocks of chunks (ops/chunk_decays.h: past 64 chunks), and in slices of key rows
// (ops/chunk_parallel.h), on the test device (DARKFORMER_TEST_DEVICE; cuda in tools/gpu_check.sh),
// against the chunk loop in fp64 on the CPU. The sums themselves against their definition:
// tests/attention/chunk_decays_test.cpp; slices against the whole call in fp64:
// tests/attention/chunk_parallel_slices_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/kernel_registry.h"
#include "attention/ops/causal_function.h"
#include "attention/ops/chunk_decays.h"
#include "attention/ops/chunk_parallel.h"
#include "attention/positive_features.h"
#include "cuda/test_device.h"

namespace darkformer {
namespace {

// Rows of 75 chunks (L = 600, chunks of 8: 9 blocks of 9, the last with 3 real chunks) and of 72
// (L = 576: 8 full blocks and one of padding alone), a batch of 2 with 4 query heads on 2 KV
// heads, performer and darkformer (keys per query head), with and without documents (each
// sequence its own, boundaries inside and across blocks of chunks), fp32 and bf16 inputs: outputs
// within 1e-4 and gradients within 1e-3 relative (extreme_scale_test.cpp's rule at ordinary
// scale), and at least 2^-8 for what bf16 stores (the output and the inputs' gradients).
TEST(DeviceChunkParallelTest, LongRowsTakeBlocksOfChunksAndHoldTheRule) {
  const auto device = testing::TestDevice();
  const int64_t batch = 2, heads = 4, kv_heads = 2, dim = 8, chunk = 8;
  for (const int64_t length : {600, 576}) ASSERT_GT(causal_ops::DecayBlockChunks(length / chunk), 0) << length;
  for (const std::string name : {"performer", "darkformer"}) {
    for (const int64_t length : {600, 576}) {
      for (const bool documents : {false, true}) {
        torch::manual_seed(5);
        const auto q = torch::randn({batch, heads, length, dim}, torch::kFloat64);
        const auto k = torch::randn({batch, kv_heads, length, dim}, torch::kFloat64);
        const auto v = torch::randn({batch, kv_heads, length, dim}, torch::kFloat64);
        const auto weights = torch::randn({batch, heads, length, dim}, torch::kFloat64);
        torch::Tensor ids;
        if (documents) ids = (torch::rand({batch, length}, torch::kFloat64) < 0.02).to(torch::kLong).cumsum(1);
        // bf16: the inputs rounded to bf16 and given so, unless the kernel computes in fp64 (the
        // reference then takes the rounded values).
        auto run = [&](const std::string& op, torch::Device on, torch::ScalarType compute, bool bf16) {
          auto kernel = MakeAttentionKernel(
              name, KernelShape{heads, dim},
              ConfigReader(YAML::Load("{num_features: 16, chunk_size: " + std::to_string(chunk) + ", op: " + op + "}"),
                           "attention." + name));
          kernel->to(on, compute);
          const auto given = compute == torch::kFloat64 ? compute : bf16 ? torch::kBFloat16 : torch::kFloat32;
          auto leaf = [&](const torch::Tensor& t) {
            return (bf16 ? t.to(torch::kBFloat16) : t).to(on, given).detach().requires_grad_();
          };
          auto ql = leaf(q), kl = leaf(k), vl = leaf(v);
          AttentionCall call;
          call.scale = 1.0 / std::sqrt(static_cast<double>(dim));
          if (documents) call.document_ids_BL = ids.to(on);
          const auto out = kernel->forward(ql, kl, vl, call);
          (out.to(torch::kFloat64) * weights.to(on)).sum().backward();
          return std::vector<torch::Tensor>{out.detach().cpu().to(torch::kFloat64), ql.grad().cpu().to(torch::kFloat64),
                                            kl.grad().cpu().to(torch::kFloat64), vl.grad().cpu().to(torch::kFloat64)};
        };
        for (const bool bf16 : {false, true}) {
          const auto want = run("chunk_loop", torch::kCPU, torch::kFloat64, bf16);
          const auto got = run("chunk_parallel", device, torch::kFloat32, bf16);
          const double storage = bf16 ? std::ldexp(1.0, -8) : 0.0;
          const std::string where = name + " L " + std::to_string(length) + (documents ? " with documents" : "") +
                                    (bf16 ? " bf16" : " fp32") + " on " + device.str();
          for (size_t i = 0; i < want.size(); ++i) {
            const double error = ((got[i] - want[i]).abs().max() / want[i].abs().max()).item<double>();
            EXPECT_LE(error, std::max(i == 0 ? 1e-4 : 1e-3, storage))
                << where << (i == 0 ? " output" : " gradient " + std::to_string(i));
          }
        }
      }
    }
  }
}

// Slices of whole sequences and of single key rows on the device (narrowed views of its tensors,
// written back through them), 4 query heads on 2 key rows, a batch of 3, packed documents or
// none, fp32: outputs within 1e-4 and the gradients of x, y, v and W within 1e-3 relative of the
// chunk loop in fp64 (the rule above).
TEST(DeviceChunkParallelTest, SlicesOfRowsHoldTheRule) {
  const auto device = testing::TestDevice();
  const int64_t batch = 3, heads = 4, rows = 2, length = 200, dim = 8, features = 16, chunk = 16;
  const ChunkParallelDims dims{batch, length, heads, rows, features, dim, chunk};
  const int64_t row = ChunkParallelWorkingBytes(dims, 1) - ChunkParallelWorkingBytes(dims, 0);
  for (const bool documents : {false, true}) {
    torch::manual_seed(9);
    const auto x = torch::randn({batch, heads, length, dim}, torch::kFloat64);
    const auto y = torch::randn({batch, rows, length, dim}, torch::kFloat64);
    const auto v = torch::randn({batch, rows, length, dim}, torch::kFloat64);
    const auto w = torch::randn({features, dim}, torch::kFloat64) * 0.5;
    const auto weights = torch::randn({batch, heads, length, dim}, torch::kFloat64);
    torch::Tensor ids;
    if (documents) ids = (torch::rand({batch, length}, torch::kFloat64) < 0.03).to(torch::kLong).cumsum(1);
    // slice_bytes < 0: the chunk loop (the reference), else the chunk-parallel form in such slices.
    auto run = [&](torch::Device on, torch::ScalarType dtype, int64_t slice_bytes) {
      auto leaf = [&](const torch::Tensor& t) { return t.to(on, dtype).detach().requires_grad_(); };
      auto xl = leaf(x), yl = leaf(y), vl = leaf(v), wl = leaf(w);
      FeatureMap map;
      map.params = {wl};
      map.positive_features = true;
      map.num_features = features;
      map.log_features = [](const torch::Tensor& t, const std::vector<torch::Tensor>& p, bool) {
        return LogPositiveFeatures(t, p[0].to(t.scalar_type()));
      };
      const auto doc = documents ? ids.to(on) : torch::Tensor();
      map.op = slice_bytes < 0 ? CausalOp::kChunkLoop : CausalOp::kChunkParallel;
      const auto out = slice_bytes < 0 ? FusedCausalLinearAttention(xl, yl, vl, map, chunk, doc)
                                       : ChunkParallelCausalAttention(xl, yl, vl, map, chunk, doc, slice_bytes);
      (out.to(torch::kFloat64) * weights.to(on)).sum().backward();
      std::vector<torch::Tensor> got = {out.detach()};
      for (const auto& t : {xl, yl, vl, wl}) got.push_back(t.grad());
      for (auto& t : got) t = t.cpu().to(torch::kFloat64);
      return got;
    };
    const auto want = run(torch::kCPU, torch::kFloat64, -1);
    for (const int64_t slice_rows : {rows, int64_t{1}}) {
      ASSERT_EQ(ChunkParallelSlice(dims, slice_rows * row), slice_rows);
      const auto got = run(device, torch::kFloat32, slice_rows * row);
      for (size_t i = 0; i < want.size(); ++i) {
        const double error = ((got[i] - want[i]).abs().max() / want[i].abs().max()).item<double>();
        EXPECT_LE(error, i == 0 ? 1e-4 : 1e-3) << "slices of " << slice_rows << " rows on " << device.str()
                                               << (documents ? " with documents" : "") << ", tensor " << i;
      }
    }
  }
}

}  // namespace
}  // namespace darkformer
