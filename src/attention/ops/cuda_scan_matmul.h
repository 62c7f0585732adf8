// The scan's matrix products (cuda_scan_body.h): out(r, c, sum_k a(r, k) b(k, c)) for r < rows,
// c < cols, the operands and the output given as functions of their indices, so one step serves
// every layout, transpose and epilogue the scan needs. Two ways to sum, both fp32 accumulation:
// - fp32 operands: each output by one thread in order of k (the first version's arithmetic);
// - tensor cores (Row::tensor_cores: bf16 inputs, or fp32 ones where LibTorch allows TF32), in
//   3xTF32: each operand split as x = hi + lo, hi = TF32(x), lo = TF32(x - hi) (TF32: 10 bits of
//   mantissa, round to nearest, ties away from zero, as PTX's cvt.rna.tf32.f32), and
//   a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi, relative error ~2^-21 per product where one TF32
//   product has 2^-10. One TF32 product is not enough: the backward's S h and Z [v, 1] cancel
//   (sharp rows: out ~ v_j, so g . v_j - g . out ~ 0), and plain TF32 missed the bf16 rule there
//   by 6-25x (device_cuda_op_test's TensorCoresHoldTheBf16RuleAtExtremeScale).
//   16 x 16 output tiles per warp, 8 deep per step (WMMA m16n16k8), staged through the warp's own
//   tiles in shared memory, which also takes any layout and ragged edge. The host emulation splits
//   and rounds its operands the same way and sums in order of k; only the order of the fp32 sums
//   differs on the device.
// Either way the result is the same from run to run (a fixed order, no atomics).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#include <mma.h>
#define DF_TENSOR_CORES 1
#endif

#include "attention/ops/cuda_scan_block.h"

namespace darkformer::cuda_scan {

// TF32's rounding of x, on the host (the device converts fragments with wmma::__float_to_tf32).
inline float RoundToTf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  // inf and NaN stay
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// a b in 3xTF32, as the tensor cores form it (the host emulation's).
inline float Tf32x3Product(float a, float b) {
  const float a_hi = RoundToTf32(a), b_hi = RoundToTf32(b);
  const float a_lo = RoundToTf32(a - a_hi), b_lo = RoundToTf32(b - b_hi);
  return a_hi * b_lo + a_lo * b_hi + a_hi * b_hi;  // the small terms first, as the device's order
}

#ifdef DF_TENSOR_CORES
// Warp w of the block takes output tiles w, w + warps, ...; its tiles in shared memory
// (Block::tiles, kTileFloats per warp): A 16 x 8, B 8 x 16, C 16 x 16, row-major.
template <typename A, typename B, typename Out>
__device__ void TensorCoreMatMul(const Block& blk, int64_t rows, int64_t cols, int64_t depth, A a, B b, Out out) {
  namespace wmma = nvcuda::wmma;
  const int warp = blk.tid / 32, lane = blk.tid % 32, warps = blk.size / 32;
  float* ta = blk.tiles + warp * kTileFloats;
  float* tb = ta + 16 * 8;
  float* tc = tb + 8 * 16;
  const int64_t col_tiles = (cols + 15) / 16, tiles = ((rows + 15) / 16) * col_tiles;
  for (int64_t tile = warp; tile < tiles; tile += warps) {
    const int64_t r0 = (tile / col_tiles) * 16, c0 = (tile % col_tiles) * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int64_t k0 = 0; k0 < depth; k0 += 8) {
      for (int e = lane; e < 128; e += 32) {
        const int64_t r = r0 + e / 8, ka = k0 + e % 8, kb = k0 + e / 16, c = c0 + e % 16;
        ta[e] = r < rows && ka < depth ? a(r, ka) : 0.0f;
        tb[e] = kb < depth && c < cols ? b(kb, c) : 0.0f;
      }
      __syncwarp();
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_hi, a_lo;
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_hi, b_lo;
      wmma::load_matrix_sync(a_hi, ta, 8);
      wmma::load_matrix_sync(b_hi, tb, 16);
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
      __syncwarp();  // every lane has loaded its fragments before the next step overwrites the tiles
    }
    wmma::store_matrix_sync(tc, acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int64_t r = r0 + e / 16, c = c0 + e % 16;
      if (r < rows && c < cols) out(r, c, tc[e]);
    }
    __syncwarp();  // the tile is read before the next one is stored
  }
  blk.Sync();
}
#endif

// out(r, c, sum) for every output, then a barrier (a step, as ParallelFor). The operands must not
// read what `out` writes.
template <typename A, typename B, typename Out>
DF_HD void MatMul(const Block& blk, bool tensor_cores, int64_t rows, int64_t cols, int64_t depth, A a, B b, Out out) {
#ifdef DF_TENSOR_CORES
  if (tensor_cores) {
    TensorCoreMatMul(blk, rows, cols, depth, a, b, out);
    return;
  }
#endif
  ParallelFor(blk, rows * cols, [&](int64_t idx) {
    const int64_t r = idx / cols, c = idx % cols;
    float acc = 0.0f;
#ifndef __CUDA_ARCH__
    if (tensor_cores) {
      for (int64_t k = 0; k < depth; ++k) acc += Tf32x3Product(a(r, k), b(k, c));
      out(r, c, acc);
      return;
    }
#endif
    for (int64_t k = 0; k < depth; ++k) acc += a(r, k) * b(k, c);
    out(r, c, acc);
  });
}

}  // namespace darkformer::cuda_scan
