// The scan's matrix products (cuda_scan_body.h): out(r, c, sum_k a(r, k) b(k, c)) for r < rows,
// c < cols, the operands and the output given as functions of their indices, so one step serves
// every layout, transpose and epilogue the scan needs. Two ways to sum, both fp32 accumulation:
// - fp32 operands: each output by one thread in order of k (the first version's arithmetic);
// - tensor cores (Row::tensor_cores: bf16 inputs, or fp32 ones where LibTorch allows TF32), each
//   operand split as x = hi + lo and a b ~ a_hi b_lo + a_lo b_hi + a_hi b_hi, three products
//   whose partial products are exact in fp32; each call site names its Split:
//   - Split::kTf32 (3xTF32: hi = TF32(x), lo = TF32(x - hi), TF32 with 10 bits of mantissa, round
//     to nearest, ties away from zero, as PTX's cvt.rna.tf32.f32): relative error ~2^-21 a
//     product. For the projections (an error there is scaled by the features' magnitude, as
//     fp32_products.h's) and for the products whose results the backward's cancellation reads:
//     the numerators (out, so g . out), S h and the reverse state's two (sharp rows: out ~ v_j,
//     so g . v_j - g . out ~ 0). One TF32 pass missed the bf16 rule there by 6-25x on an H200.
//   - Split::kBf16 (bf16x3: hi = bf16(x), lo = bf16(x - hi), to nearest even): ~2^-16.5 a
//     product, on bf16's tensor cores, twice TF32's rate on an H100 or H200. For the fold into a
//     state, the two dv products and d x' = da W, where the host emulation's extreme-scale tests
//     keep the errors they have under 3xTF32; everywhere, bf16x3 took aderf's gradients at
//     |x| = 10 past their bound (docs/cuda_op.md, "bf16x3").
//   Panels of outputs staged whole through shared memory (below), which also takes any layout and
//   ragged edge; 16 x 16 output tiles per warp, 8 deep per step in TF32 (WMMA m16n16k8), 16 in
//   bf16 (m16n16k16). The host emulation walks the same panels, splits and rounds its operands the
//   same way and sums in order of k; on the device the order of the fp32 sums inside a step
//   differs, and each step adds its three products in turn.
// Either way the result is the same from run to run (a fixed order, no atomics).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#include <cuda_bf16.h>
#include <mma.h>
#define DF_TENSOR_CORES 1
#endif

#include "attention/ops/cuda_scan_bf16.h"
#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_panels.h"

namespace darkformer::cuda_scan {

// TF32's rounding of x, as wmma::__float_to_tf32 converts the device's fragments (the host
// emulation's, and both executors' for the columns past the last panel, below).
DF_HD inline float RoundToTf32(float x) {
#ifdef __CUDA_ARCH__
  uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  // inf and NaN stay
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// a b from its operands' halves, a_lo b_lo dropped: the small terms first, as the device's order.
DF_HD inline float SplitSum(float a_hi, float a_lo, float b_hi, float b_lo) {
  return a_hi * b_lo + a_lo * b_hi + a_hi * b_hi;
}

// a b in 3xTF32, as the tensor cores form it (the host emulation's).
DF_HD inline float Tf32x3Product(float a, float b) {
  const float a_hi = RoundToTf32(a), b_hi = RoundToTf32(b);
  return SplitSum(a_hi, RoundToTf32(a - a_hi), b_hi, RoundToTf32(b - b_hi));
}

// bf16's rounding of x (FloatToBf16: to nearest even, as __float2bfloat16_rn), as fp32.
DF_HD inline float RoundToBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// a b in bf16x3 (8-bit halves: each partial product exact in fp32), as the tensor cores form it.
DF_HD inline float Bf16x3Product(float a, float b) {
  const float a_hi = RoundToBf16(a), b_hi = RoundToBf16(b);
  return SplitSum(a_hi, RoundToBf16(a - a_hi), b_hi, RoundToBf16(b - b_hi));
}

// How a tensor-core product splits its operands (the header above).
enum class Split { kTf32, kBf16 };
template <Split kSplit>
DF_HD inline float SplitProduct(float a, float b) {
  if constexpr (kSplit == Split::kTf32) {
    return Tf32x3Product(a, b);
  } else {
    return Bf16x3Product(a, b);
  }
}

#ifdef DF_TENSOR_CORES
// WMMA's layout tag for a panel staged in kMajor's order.
template <Major kMajor>
using WmmaLayout = std::conditional_t<kMajor == Major::kRow, nvcuda::wmma::row_major, nvcuda::wmma::col_major>;

// One WMMA step of tile `tile` at depth kk of the staged panels into acc, in three products (the
// small terms first): TF32 fragments loaded from the fp32 panels and split in registers; or bf16
// fragments loaded from the halves staged already split (StoreHalves).

template <Major kA, Major kB>
__device__ inline void Tf32x3Step(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>& acc,
                                  const float* pa, const float* pb, int tile, int kk) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, WmmaLayout<kA>> a_hi, a_lo;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, WmmaLayout<kB>> b_hi, b_lo;
  wmma::load_matrix_sync(a_hi, TileA<kA>(pa, tile, kk), kLeadA<kA>);
  wmma::load_matrix_sync(b_hi, TileB<kB>(pb, tile, kk), kLeadB<kB>);
  for (int i = 0; i < a_hi.num_elements; ++i) {
    const float x = a_hi.x[i], hi = wmma::__float_to_tf32(x);
    a_hi.x[i] = hi;
    a_lo.x[i] = wmma::__float_to_tf32(x - hi);
  }
  for (int i = 0; i < b_hi.num_elements; ++i) {
    const float x = b_hi.x[i], hi = wmma::__float_to_tf32(x);
    b_hi.x[i] = hi;
    b_lo.x[i] = wmma::__float_to_tf32(x - hi);
  }
  wmma::mma_sync(acc, a_hi, b_lo, acc);
  wmma::mma_sync(acc, a_lo, b_hi, acc);
  wmma::mma_sync(acc, a_hi, b_hi, acc);
}

// The bf16 halves of a staged panel: hi then lo, each as many elements as the fp32 panel, so both
// fill the fp32 panel's bytes.
struct Halves {
  const __nv_bfloat16 *hi, *lo;
};

template <Major kA, Major kB>
__device__ inline void Bf16x3Step(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>& acc,
                                  Halves pa, Halves pb, int tile, int kk) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, WmmaLayout<kA>> a_hi, a_lo;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, WmmaLayout<kB>> b_hi, b_lo;
  wmma::load_matrix_sync(a_hi, TileA<kA>(pa.hi, tile, kk), kLeadA<kA>);
  wmma::load_matrix_sync(a_lo, TileA<kA>(pa.lo, tile, kk), kLeadA<kA>);
  wmma::load_matrix_sync(b_hi, TileB<kB>(pb.hi, tile, kk), kLeadB<kB>);
  wmma::load_matrix_sync(b_lo, TileB<kB>(pb.lo, tile, kk), kLeadB<kB>);
  wmma::mma_sync(acc, a_hi, b_lo, acc);
  wmma::mma_sync(acc, a_lo, b_hi, acc);
  wmma::mma_sync(acc, a_hi, b_hi, acc);
}

// Warp w takes tiles w, w + warps, ... of each panel (kPanelTiles / warps each: kThreads warps
// cover a panel in one pass); tiles and steps beyond the product's edges are skipped whole. In
// bf16 the block stages the operands' halves (StoreHalves).
template <Split kSplit, Major kA, Major kB, typename A, typename B, typename Out>
__device__ void TensorCoreMatMul(const Block& blk, int64_t rows, int64_t cols, int64_t depth, A a, B b, Out out) {
  namespace wmma = nvcuda::wmma;
  constexpr bool kBf16 = kSplit == Split::kBf16;
  constexpr int kWarps = kThreads / 32, kTilesPerWarp = kPanelTiles / kWarps, kStep = kBf16 ? 16 : 8;
  static_assert(kPanelTiles % kWarps == 0, "every warp the same number of tiles");
  static_assert(kPanelDepth % 16 == 0, "whole bf16 WMMA steps");
  const int warp = blk.tid / 32, lane = blk.tid % 32;
  float* pa = blk.tiles;
  float* pb = pa + kPanelA;
  float* pc = pb + kPanelB + warp * 256;
  // The bf16 halves in the fp32 panels' place (32-byte aligned: WMMA's loads ask it).
  uint16_t* a_halves = reinterpret_cast<uint16_t*>(pa);
  uint16_t* b_halves = reinterpret_cast<uint16_t*>(pb);
  const Halves ha{reinterpret_cast<const __nv_bfloat16*>(a_halves),
                  reinterpret_cast<const __nv_bfloat16*>(a_halves + kPanelA)};
  const Halves hb{reinterpret_cast<const __nv_bfloat16*>(b_halves),
                  reinterpret_cast<const __nv_bfloat16*>(b_halves + kPanelB)};
  auto put = [](float* panel, uint16_t* halves, int n) {
    return [=](int e, float x) {
      if constexpr (kBf16) {
        StoreHalves(halves, n, e, x);
      } else {
        panel[e] = x;
      }
    };
  };
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, kStep, float>;
  for (int64_t r0 = 0; r0 < rows; r0 += kPanelRows) {
    for (int64_t c0 = 0; c0 < cols; c0 += kPanelCols) {
      Acc acc[kTilesPerWarp];
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) wmma::fill_fragment(acc[t], 0.0f);
      for (int64_t k0 = 0; k0 < depth; k0 += kPanelDepth) {
        StagePanels<kA, kB>(blk, rows, cols, depth, r0, c0, k0, a, b, put(pa, a_halves, kPanelA),
                            put(pb, b_halves, kPanelB));
#pragma unroll  // the accumulators stay in registers
        for (int t = 0; t < kTilesPerWarp; ++t) {
          const int tile = warp + t * kWarps;
          if (r0 + TileRow(tile) >= rows || c0 + TileCol(tile) >= cols) continue;  // uniform in the warp
          for (int kk = 0; kk < kPanelDepth && k0 + kk < depth; kk += kStep) {
            if constexpr (kBf16) {
              Bf16x3Step<kA, kB>(acc[t], ha, hb, tile, kk);
            } else {
              Tf32x3Step<kA, kB>(acc[t], pa, pb, tile, kk);
            }
          }
        }
        blk.Sync();  // every warp has read the panels before the next step stages its own
      }
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        const int tile = warp + t * kWarps;
        if (r0 + TileRow(tile) >= rows || c0 + TileCol(tile) >= cols) continue;
        wmma::store_matrix_sync(pc, acc[t], 16, wmma::mem_row_major);
        __syncwarp();
        EmitTile(pc, rows, cols, r0, c0, tile, lane, 32, out);
        __syncwarp();  // the tile is read before the next one is stored
      }
    }
  }
  blk.Sync();
}
#endif

// The host's emulation of TensorCoreMatMul: the same panels, tiles and barriers. Warp w of the
// block's threads (one warp of one thread where the host runs one) takes tiles w, w + warps, ...,
// as on the device: its first lane sums them, each in order of k, each product split as kSplit's
// (SplitProduct), and its lanes emit them. In bf16 it stages and reads the halves as the device
// does (StoreHalves, TileA and TileB on them), so their layout is proven here; the sums are
// Bf16x3Product's to the bit.
constexpr int kEmulatedMatMulFloats = kPanelA + kPanelB + kPanelTiles * 256;
template <Split kSplit, Major kA, Major kB, typename A, typename B, typename Out>
void EmulatedTensorCoreMatMul(const Block& blk, float* shared, uint16_t* halves, int64_t rows, int64_t cols,
                              int64_t depth, A a, B b, Out out) {
  float* pa = shared;
  float* pb = pa + kPanelA;
  float* pc = pb + kPanelB;  // every tile of the panel, 256 floats each
  uint16_t* a_halves = halves;  // 2 kPanelA, then 2 kPanelB: the device's bytes of pa and pb
  uint16_t* b_halves = halves + 2 * kPanelA;
  constexpr bool kBf16 = kSplit == Split::kBf16;
  const int warps = (blk.size + 31) / 32, warp = blk.tid / 32, lane = blk.tid % 32;
  const int lanes = blk.size - warp * 32 < 32 ? blk.size - warp * 32 : 32;
  static const float zeros[256] = {};  // a tile no step reached (depth 0)
  for (int64_t r0 = 0; r0 < rows; r0 += kPanelRows) {
    for (int64_t c0 = 0; c0 < cols; c0 += kPanelCols) {
      auto inside = [&](int tile) { return r0 + TileRow(tile) < rows && c0 + TileCol(tile) < cols; };
      for (int64_t k0 = 0; k0 < depth; k0 += kPanelDepth) {
        StagePanels<kA, kB>(
            blk, rows, cols, depth, r0, c0, k0, a, b,
            [&](int e, float x) { kBf16 ? StoreHalves(a_halves, kPanelA, e, x) : void(pa[e] = x); },
            [&](int e, float x) { kBf16 ? StoreHalves(b_halves, kPanelB, e, x) : void(pb[e] = x); });
        for (int tile = warp; lane == 0 && tile < kPanelTiles; tile += warps) {
          if (!inside(tile)) continue;
          float* acc = pc + tile * 256;
          if (k0 == 0) {
            for (int e = 0; e < 256; ++e) acc[e] = 0.0f;  // after the staging's barrier: the last emit is done
          }
          for (int kk = 0; kk < kPanelDepth && k0 + kk < depth; kk += 8) {
            const float *ta = TileA<kA>(pa, tile, kk), *tb = TileB<kB>(pb, tile, kk);
            const uint16_t *ta_hi = TileA<kA>(a_halves, tile, kk), *tb_hi = TileB<kB>(b_halves, tile, kk);
            const uint16_t *ta_lo = ta_hi + kPanelA, *tb_lo = tb_hi + kPanelB;
            for (int e = 0; e < 256; ++e) {
              const int i = e / 16, j = e % 16;
              for (int k = 0; k < 8 && k0 + kk + k < depth; ++k) {
                const int at = PanelA<kA>(i, k), bt = PanelB<kB>(k, j);
                if constexpr (kBf16) {  // Bf16x3Product's sum, from the staged halves
                  acc[e] += SplitSum(Bf16ToFloat(ta_hi[at]), Bf16ToFloat(ta_lo[at]), Bf16ToFloat(tb_hi[bt]),
                                     Bf16ToFloat(tb_lo[bt]));
                } else {
                  acc[e] += Tf32x3Product(ta[at], tb[bt]);
                }
              }
            }
          }
        }
        blk.Sync();  // every warp has read the panels before the next step stages its own
      }
      for (int tile = warp; tile < kPanelTiles; tile += warps) {
        if (inside(tile)) EmitTile(depth > 0 ? pc + tile * 256 : zeros, rows, cols, r0, c0, tile, lane, lanes, out);
      }
    }
  }
  blk.Sync();
}

// The columns past the last whole panel that the panels leave to the threads: at most this
// many (less than a tile's width). The scan's [v, 1] products have Dv + 1 = 257 columns, and a
// panel round for their one normaliser column would cost as much as a round for a whole panel's
// columns: 5 rounds where 4 do. Such a column's outputs sum split as the panels' (SplitProduct).
constexpr int64_t kThreadTailCols = 15;
DF_HD inline int64_t ThreadTailCols(int64_t cols) {
  const int64_t tail = cols % kPanelCols;
  return cols > kPanelCols && tail <= kThreadTailCols ? tail : 0;
}

// The threads that share one tail output, each summing a run of its depth in order of k, the runs'
// sums then added in order: as many as a block's kThreads give each of `outputs`, no more than
// the depth's batches of kStageBatch (so each thread's loads are in flight together). A state read
// (G S rows, m = 256 deep) by one thread per row waited on 32 batches of loads in turn, the rest of
// the block idle at the barrier; in 32 runs of 8 at G S = 8, on one. The count is the device's
// block's, not the executor's: the host's one thread sums the same runs.
DF_HD inline int64_t TailParts(int64_t outputs, int64_t depth) {
  const int64_t batches = (depth + kStageBatch - 1) / kStageBatch;
  const int64_t share = kThreads / (outputs > 0 ? outputs : 1), parts = share < batches ? share : batches;
  return parts < 1 ? 1 : parts;
}
// Each run's depth: whole batches.
DF_HD inline int64_t TailRun(int64_t depth, int64_t parts) {
  const int64_t run = (depth + parts - 1) / parts;
  return (run + kStageBatch - 1) / kStageBatch * kStageBatch;
}

// sum_k a(r, k) b(k, c) for k in [first, last) in order of k, split as kSplit's, kStageBatch steps'
// operands read before they are summed: their loads in flight together.
template <Split kSplit, typename A, typename B>
DF_HD float TailSum(int64_t r, int64_t c, int64_t first, int64_t last, A a, B b) {
  float acc = 0.0f;
#ifdef __CUDA_ARCH__
#pragma unroll 1  // rarely run: its code small beside the panels' (registers)
#endif
  for (int64_t k0 = first; k0 < last; k0 += kStageBatch) {
    float xa[kStageBatch], xb[kStageBatch];
    DF_UNROLL for (int i = 0; i < kStageBatch; ++i) {
      const bool in = k0 + i < last;
      xa[i] = in ? a(r, k0 + i) : 0.0f;
      xb[i] = in ? b(k0 + i, c) : 0.0f;
    }
    DF_UNROLL for (int i = 0; i < kStageBatch; ++i) {
      if (k0 + i < last) acc += SplitProduct<kSplit>(xa[i], xb[i]);
    }
  }
  return acc;
}

// out(r, c, sum) for every output, then a barrier (a step, as ParallelFor). The operands must not
// read what `out` writes. kSplit: how tensor cores split the operands (the header above); kA, kB:
// how the operands lie in memory (Major), which sets only the order the block stages them in.
template <Split kSplit, Major kA = Major::kRow, Major kB = Major::kRow, typename A, typename B, typename Out>
DF_HD void MatMul(const Block& blk, bool tensor_cores, int64_t rows, int64_t cols, int64_t depth, A a, B b, Out out) {
#if defined(DF_TENSOR_CORES) || !defined(__CUDA_ARCH__)  // else (a device before sm_80): fp32, below
  if (tensor_cores) {
    const int64_t tail = ThreadTailCols(cols), panels = cols - tail;
#ifdef DF_TENSOR_CORES
    TensorCoreMatMul<kSplit, kA, kB>(blk, rows, panels, depth, a, b, out);
    float* runs = blk.tiles;  // free once the panels are done (their last barrier)
#else
    thread_local std::vector<float> shared(kEmulatedMatMulFloats);  // the block's shared memory
    thread_local std::vector<uint16_t> halves(2 * (kPanelA + kPanelB));  // its panels' bf16 halves
    EmulatedTensorCoreMatMul<kSplit, kA, kB>(blk, shared.data(), halves.data(), rows, panels, depth, a, b, out);
    float* runs = shared.data();
#endif
    if (tail > 0) {
      // parts > 1: outputs x parts <= kThreads, so the runs' sums fit where the A panel was staged.
      static_assert(kThreads <= kPanelA, "a tail's runs fit the A panel's shared memory");
      // 32-bit index arithmetic (a block's outputs are far fewer than 2^31): 64-bit divisions cost
      // registers the kernels do not have.
      const int outputs = static_cast<int>(rows * tail), parts = static_cast<int>(TailParts(outputs, depth)),
                run = static_cast<int>(TailRun(depth, parts)), tails = static_cast<int>(tail);
      ParallelFor(blk, outputs * parts, [&](int64_t at) {
        const int idx = static_cast<int>(at), o = idx / parts, first = (idx % parts) * run;
        const int64_t last = first + run < depth ? first + run : depth;
        const float sum = TailSum<kSplit>(o / tails, panels + o % tails, first, last, a, b);
        if (parts == 1) {
          out(o / tails, panels + o % tails, sum);
        } else {
          runs[idx] = sum;
        }
      });
      if (parts > 1) {
        ParallelFor(blk, outputs, [&](int64_t at) {
          const int o = static_cast<int>(at);
          float acc = 0.0f;
          for (int p = 0; p < parts; ++p) acc += runs[o * parts + p];
          out(o / tails, panels + o % tails, acc);
        });
      }
    }
    return;
  }
#endif
  ParallelFor(blk, rows * cols, [&](int64_t idx) {
    const int64_t r = idx / cols, c = idx % cols;
    float acc = 0.0f;
    for (int64_t k = 0; k < depth; ++k) acc += a(r, k) * b(k, c);
    out(r, c, acc);
  });
}

}  // namespace darkformer::cuda_scan
