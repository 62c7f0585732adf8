// The executor of the CUDA operator's scan (cuda_scan_body.h): a CUDA block, or one host thread
// that emulates it, and its one kind of step.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DF_HD __host__ __device__
#define DF_EXP2 exp2f
#else
#include <cmath>
#define DF_HD
#define DF_EXP2 std::exp2
#endif
// A step inlined into its kernel whatever its size: out of line, the call's ABI caps the kernel at
// 128 registers and spills (the query side's, when its staging batched its loads).
#ifdef __CUDACC__
#define DF_HD_INLINE __host__ __device__ __forceinline__
#else
#define DF_HD_INLINE inline
#endif
// A loop of constant count unrolled on the device (its arrays then live in registers).
#ifdef __CUDA_ARCH__
#define DF_UNROLL _Pragma("unroll")
#define DF_NO_UNROLL _Pragma("unroll 1")
#else
#define DF_UNROLL
#define DF_NO_UNROLL
#endif

namespace darkformer::cuda_scan {

// Threads per block of every launch (cuda_scan.cu); the tensor-core products' panels
// (cuda_scan_matmul.h): kPanelRows x kPanelCols outputs at a time, kPanelDepth deep per staged
// step; and the floats of shared memory a block holds for them: the two operand panels and one
// 16 x 16 output tile per warp.
constexpr int kThreads = 256;
// The scans over chunks (EnteringStates, ReverseStates): threads per block, enough for one feature's
// row of a state at Gemma's Dv + 1 = 257 one element each; and the chunks whose loads each element's
// chain issues at once (they do not depend on the chain, so they are in flight together).
constexpr int kScanThreads = 288;
constexpr int kScanDepth = 8;
// Blocks of a scan per SM that its registers must allow (__launch_bounds__): more chains in flight.
constexpr int kScanBlocksPerSm = 3;
// Square panels of 64: a product stages its B operand (the projection, a state, W: 256 KiB at
// Gemma 2B's shape) once per 64 output rows, so a sub-chunk's G S query rows read it half as often
// as in panels of 32 rows (docs/cuda_op.md, "What a sub-chunk reads"); two tiles per warp, as 32 x 128.
constexpr int kPanelRows = 64, kPanelCols = 64, kPanelDepth = 32;
// Elements a thread reads before it puts any (BatchedPuts: ParallelLoad, the products' staging and
// their columns by thread): their loads in flight together, one memory latency a batch; 8 is all
// of a thread's share of a panel (kPanelA / kThreads), so a staging round waits on two.
constexpr int kStageBatch = 8;
constexpr int kMatMulFloats = kPanelRows * kPanelDepth + kPanelDepth * kPanelCols + (kThreads / 32) * 256;

// The host emulation's threads of one block, fibers switched at its barriers (cuda_scan_threads.h):
// a barrier, and one that also ORs a flag over the block's threads.
struct HostThreads;
void HostBarrier(HostThreads* threads);
bool HostBarrierOr(HostThreads* threads, int tid, bool flag);

// The executor: a CUDA block (tid = threadIdx.x of size = blockDim.x, tiles its kMatMulFloats of
// shared memory for the products), or the host's emulation of one: one thread (0 of 1, `threads`
// null), or `size` fibers of a host thread (cuda_scan_threads.h); no tiles: its products hold their own.
struct Block {
  int tid = 0, size = 1;
  float* tiles = nullptr;
  HostThreads* threads = nullptr;  // host only
  DF_HD void Sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#else
    if (threads != nullptr) HostBarrier(threads);
#endif
  }
};

// *to += value where other blocks may add to the same element in the same launch: an atomic add on
// the device (its order, and so the sum's last bits, may change from run to run), in order on the
// host thread.
DF_HD inline void AddShared(float* to, float value) {
#ifdef __CUDA_ARCH__
  atomicAdd(to, value);
#else
  *to += value;
#endif
}

// f(i) for i in [0, n), split between the block's threads, then a barrier.
template <typename F>
DF_HD void ParallelFor(const Block& b, int64_t n, F f) {
  for (int64_t i = b.tid; i < n; i += b.size) f(i);
  b.Sync();
}

// put(i, get(i)) for i < n, split between the block's threads, each issuing kStageBatch gets
// before their puts, so a thread's loads are in flight together (get and put in turn wait on every
// load: a put may alias a later get). Both executors run it (the host's block is one thread).
template <typename Get, typename Put>
DF_HD void BatchedPuts(const Block& b, int64_t n, Get get, Put put) {
  const int64_t stride = b.size;
  for (int64_t i0 = b.tid; i0 < n; i0 += stride * kStageBatch) {
    float x[kStageBatch];
    DF_UNROLL for (int k = 0; k < kStageBatch; ++k) {
      const int64_t i = i0 + k * stride;
      x[k] = i < n ? get(i) : 0.0f;
    }
    DF_UNROLL for (int k = 0; k < kStageBatch; ++k) {
      const int64_t i = i0 + k * stride;
      if (i < n) put(i, x[k]);
    }
  }
}

// ParallelFor of a step that reads memory and puts what it read: BatchedPuts, then a barrier.
template <typename Get, typename Put>
DF_HD void ParallelLoad(const Block& b, int64_t n, Get get, Put put) {
  BatchedPuts(b, n, get, put);
  b.Sync();
}

// f(i) for i in [first, last), from first + lane % (last - first) on, wrapping round: a warp whose
// threads each walk a row, rows a multiple of 32 floats apart, then reads 32 banks of shared memory
// a step instead of one. The order is the thread's own, a fixed function of its lane.
template <typename F>
DF_HD void WalkFromLane(int64_t lane, int64_t first, int64_t last, F f) {
  if (first >= last) return;
  int64_t i = first + lane % (last - first);
  for (int64_t step = first; step < last; ++step) {
    f(i);
    i = i + 1 < last ? i + 1 : first;
  }
}

// Whether pred(i) holds for some i in [0, n), split between the block's threads: every thread gets
// the answer (a barrier: __syncthreads_or on the device).
template <typename P>
DF_HD bool AnyOf(const Block& b, int64_t n, P pred) {
  bool any = false;
  for (int64_t i = b.tid; i < n; i += b.size) any = any || pred(i);
#ifdef __CUDA_ARCH__
  return __syncthreads_or(any ? 1 : 0) != 0;
#else
  return b.threads != nullptr ? HostBarrierOr(b.threads, b.tid, any) : any;
#endif
}

// The least f(i) over i in [0, n), where f's values lie in [0, hi] (hi where none is less): every
// thread gets it, by bisection on AnyOf (one barrier per bit of hi).
template <typename F>
DF_HD int64_t MinOf(const Block& b, int64_t n, int64_t hi, F f) {
  int64_t step = 1;
  while (step * 2 <= hi) step *= 2;
  int64_t least = 0;  // every f(i) >= least
  for (; step > 0; step /= 2) {
    const int64_t next = least + step;
    if (next <= hi && !AnyOf(b, n, [&](int64_t i) { return f(i) < next; })) least = next;
  }
  return least;
}

// A chain that one thread walks over steps 0 .. steps - 1, its running values in registers (the
// scans over chunks), in batches of kScanDepth steps from s0 = 0, kScanDepth, ...: load(s0, k)
// gives step s0 + k's inputs, which never depend on the chain, so a batch's loads are issued at
// once and are in flight together; then step(s0, k, inputs) advances the chain, in order; next()
// between batches (a caller whose pointers walk with the batch: offsets of k only, fewer registers).
// No barrier inside.
template <typename Load, typename Step, typename Next>
DF_HD void BatchedChain(int64_t steps, Load load, Step step, Next next) {
  using Inputs = decltype(load(int64_t{0}, 0));
  for (int64_t s0 = 0; s0 < steps; s0 += kScanDepth) {
    Inputs in[kScanDepth];
    const int64_t depth = steps - s0 < kScanDepth ? steps - s0 : kScanDepth;
    DF_UNROLL
    for (int k = 0; k < kScanDepth; ++k) {
      if (k >= depth) continue;
      in[k] = load(s0, k);
    }
    DF_UNROLL
    for (int k = 0; k < kScanDepth; ++k) {
      if (k >= depth) continue;
      step(s0, k, in[k]);
    }
    if (s0 + kScanDepth < steps) next();
  }
}

}  // namespace darkformer::cuda_scan
