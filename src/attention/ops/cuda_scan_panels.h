// The panels of op: cuda's matrix products (cuda_scan_matmul.h): where a product's operands are
// staged in shared memory and in what order, where its tiles start, how a bf16x3 product's halves
// lie, and how a finished tile reaches its outputs (EmitTile; InPlace epilogues). Both executors
// use these, so the host emulation proves the offsets the device's tensor cores read.
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_bf16.h"
#include "attention/ops/cuda_scan_block.h"

namespace darkformer::cuda_scan {

// The tensor-core path works a product in panels (cuda_scan_block.h: kPanelRows x kPanelCols of
// outputs at a time, kPanelDepth deep per step): the whole block stages the step's operand panels
// into shared memory, each element once (consecutive threads take consecutive elements, so rows
// of the operands load coalesced), then each warp multiplies its 16 x 16 tiles of the panel from
// there, 8 deep per WMMA step, and writes them out through its own 16 x 16 tile. The host
// emulation walks the same panels, tiles and offsets, and forms each tile's sums in order of k
// as the device's accumulator does (only the order inside one WMMA step differs there).
constexpr int kPanelTileCols = kPanelCols / 16, kPanelTiles = (kPanelRows / 16) * kPanelTileCols;
constexpr int kPanelA = kPanelRows * kPanelDepth, kPanelB = kPanelDepth * kPanelCols;

// How an operand lies in memory, and so how its panel is staged: kRow, A's k (B's c) contiguous;
// kCol, A's rows (B's k) contiguous, as where A(i, j) = x[j * m + i]. Consecutive threads stage
// consecutive elements of memory either way, and store them to consecutive words of the panel,
// which then lies in the same order (row- or column-major); the tensor cores load it as such
// (WMMA's row_major / col_major). Staged across its contiguous run instead, a warp's 32 reads
// would lie a row apart (m = 256 floats at Gemma 2B's shape): all on one bank of shared memory, or
// each on its own line of global memory.
enum class Major { kRow, kCol };
// Element (r, k) of A's panel and (k, c) of B's, by how each is staged, and their leading dimension.
template <Major kA>
DF_HD constexpr int PanelA(int r, int k) { return kA == Major::kRow ? r * kPanelDepth + k : k * kPanelRows + r; }
template <Major kB>
DF_HD constexpr int PanelB(int k, int c) { return kB == Major::kRow ? k * kPanelCols + c : c * kPanelDepth + k; }
template <Major kA>
constexpr int kLeadA = kA == Major::kRow ? kPanelDepth : kPanelRows;
template <Major kB>
constexpr int kLeadB = kB == Major::kRow ? kPanelCols : kPanelDepth;
static_assert(kPanelRows % 16 == 0 && kPanelCols % 16 == 0 && kPanelDepth % 8 == 0, "whole WMMA tiles");

// Panel (r0, c0, k0)'s operands, element e of pa (kPanelRows x kPanelDepth) and of pb
// (kPanelDepth x kPanelCols), in kA's and kB's order (PanelA, PanelB), to put_a(e, x) and
// put_b(e, x), zeros beyond the product's edges; then a barrier. A thread reads its elements in
// batches before it puts them (BatchedPuts): 2 memory latencies a round (A's 8, B's 8), where
// reading and putting each in turn waited on every load (16 a round).
template <Major kA, Major kB, typename A, typename B, typename PutA, typename PutB>
DF_HD void StagePanels(const Block& blk, int64_t rows, int64_t cols, int64_t depth, int64_t r0, int64_t c0,
                       int64_t k0, A a, B b, PutA put_a, PutB put_b) {
  auto get_a = [&](int64_t e) {
    const int64_t r = r0 + (kA == Major::kRow ? e / kPanelDepth : e % kPanelRows);
    const int64_t k = k0 + (kA == Major::kRow ? e % kPanelDepth : e / kPanelRows);
    return r < rows && k < depth ? a(r, k) : 0.0f;
  };
  auto get_b = [&](int64_t e) {
    const int64_t k = k0 + (kB == Major::kRow ? e / kPanelCols : e % kPanelDepth);
    const int64_t c = c0 + (kB == Major::kRow ? e % kPanelCols : e / kPanelDepth);
    return k < depth && c < cols ? b(k, c) : 0.0f;
  };
  BatchedPuts(blk, kPanelA, get_a, put_a);
  BatchedPuts(blk, kPanelB, get_b, put_b);
  blk.Sync();
}

// Tile `tile` of a panel: its first row and column inside the panel; and where its operands'
// 8-deep step at kk starts in pa and pb (leading dimensions kLeadA, kLeadB).
DF_HD inline int TileRow(int tile) { return (tile / kPanelTileCols) * 16; }
DF_HD inline int TileCol(int tile) { return (tile % kPanelTileCols) * 16; }
template <Major kA, typename T>
DF_HD inline const T* TileA(const T* pa, int tile, int kk) { return pa + PanelA<kA>(TileRow(tile), kk); }
template <Major kB, typename T>
DF_HD inline const T* TileB(const T* pb, int tile, int kk) { return pb + PanelB<kB>(kk, TileCol(tile)); }

// A staged element x of a bf16x3 product's panel as its halves: hi = bf16(x) at e, lo =
// bf16(x - hi) at n + e (n: the panel's elements), so the panel's halves fill its fp32 bytes.
// The block splits each operand once as it stages it; the warps load fragments ready to multiply.
DF_HD inline void StoreHalves(uint16_t* halves, int n, int e, float x) {
  const uint16_t hi = FloatToBf16(x);
  halves[e] = hi;
  halves[n + e] = FloatToBf16(x - Bf16ToFloat(hi));
}

// A finished 16 x 16 tile (row-major in pc) of panel (r0, c0) to `out`, lanes [lane, 32) step 32
// apart of it, inside the product's edges.
template <typename Out>
DF_HD void EmitTile(const float* pc, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int tile, int lane,
                    int lanes, Out out) {
  for (int e = lane; e < 256; e += lanes) {
    const int64_t r = r0 + TileRow(tile) + e / 16, c = c0 + TileCol(tile) + e % 16;
    if (r < rows && c < cols) out(r, c, pc[e]);
  }
}

// An epilogue that reads the output it writes (a fold into a state, a term added to a gradient):
// at(r, c), the output's address; combine(r, c, old, sum), its new value. Called alone it reads and
// writes one output; EmitTile reads a batch of them before it writes any, their loads in flight
// together, where out(r, c, sum) in turn could not start a read before the write before it (which,
// for all the compiler knows, may be to the same address): a memory latency per output. `reads`
// false (the block's, uniform): combine ignores old this time (a fold into a state not yet made),
// so nothing is read and old is 0: the first fold of a chunk read its whole m (Dv + 1) slot for
// nothing, which at one sub-chunk a chunk is half the state traffic of its own state's step.
template <typename At, typename Combine>
struct InPlace {
  At at;
  Combine combine;
  bool reads;
  DF_HD void operator()(int64_t r, int64_t c, float sum) const {
    float* p = at(r, c);
    *p = combine(r, c, reads ? *p : 0.0f, sum);
  }
};
template <typename At, typename Combine>
DF_HD InPlace<At, Combine> Updating(At at, Combine combine, bool reads = true) {
  return {at, combine, reads};
}

// Outputs a lane of EmitTile reads before it writes any (an InPlace epilogue): 2 batches of a
// tile's 8 a lane. At 8 (kStageBatch) ptxas spilled 280 bytes a thread in QuerySideKernel.
constexpr int kEpilogueBatch = 4;
template <typename At, typename Combine>
DF_HD void EmitTile(const float* pc, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int tile, int lane,
                    int lanes, const InPlace<At, Combine>& out) {
  for (int e0 = lane; e0 < 256; e0 += lanes * kEpilogueBatch) {
    float old[kEpilogueBatch];
    DF_UNROLL for (int k = 0; k < kEpilogueBatch; ++k) {
      const int e = e0 + k * lanes;
      const int64_t r = r0 + TileRow(tile) + e / 16, c = c0 + TileCol(tile) + e % 16;
      old[k] = out.reads && e < 256 && r < rows && c < cols ? *out.at(r, c) : 0.0f;
    }
    DF_UNROLL for (int k = 0; k < kEpilogueBatch; ++k) {
      const int e = e0 + k * lanes;
      const int64_t r = r0 + TileRow(tile) + e / 16, c = c0 + TileCol(tile) + e % 16;
      if (e < 256 && r < rows && c < cols) *out.at(r, c) = out.combine(r, c, old[k], pc[e]);
    }
  }
}

}  // namespace darkformer::cuda_scan
