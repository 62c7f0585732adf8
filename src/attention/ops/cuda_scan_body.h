// The CUDA operator's scan (op: cuda; cuda_scan.h), written once for two executors: a CUDA block
// (cuda_scan.cu) and one host thread that emulates it (cuda_scan_host.cpp), so the tests run the
// device's own arithmetic and indexing on a CPU. Every step is a loop whose iterations are
// independent (ParallelFor: the block's threads split it, then wait at a barrier), or a matrix
// product (MatMul, cuda_scan_matmul.h: on tensor cores where Row::tensor_cores); a step reads only
// what earlier steps wrote, so the emulation, which runs iterations one after another, computes
// what the block computes. Each sum runs in a fixed order: results are the same from run to run.
//
// The algorithm is the raw CPU kernel's (raw_cpu_kernel.h, per_feature_chunks.h) on base-2
// log-features: a_t for the G query heads that read a key row and l_j for its keys, each given or
// projected here one sub-chunk at a time (cuda_scan_queries.h, cuda_scan_keys.h): sub-chunks of S positions; the state S_i = sum_j 2^(l_ji - R_i) [v_j, 1] per feature relative to
// its running max R_i; a query reads it with 2^((a_ti + R_i(e')) - s_t) <= 1, its own sub-chunk's
// keys pair by pair with 2^((a_ti + l_ji) - s_t), s_t = max_i (a_ti + R_i(t)), so the pair attaining
// s_t gives an exact 1 and the normaliser is >= 1. The backward (cuda_scan_backward_body.h) reads
// the states entering the chunks of `group_subs` sub-chunks, which it recomputes, and a reverse
// scan of its own.
//
// Packed documents (document_mask.h) are read here, on the device: a document starts where a row's
// id changes. Every running quantity restarts there, as if each document ran alone: the running
// max R, the pairs (key j pairs with query t only from t's document start on), the state (read only
// by queries whose document began before their sub-chunk; folded from the sub-chunk's last start),
// and the merges between chunks and sub-chunks (a chunk or sub-chunk holding a start passes nothing
// of what came before it). Every such mask is a select, never a product: a factor from another
// document may exceed 1, and 0 * inf is NaN.
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_block.h"
#include "attention/ops/cuda_scan_keys.h"
#include "attention/ops/cuda_scan_matmul.h"
#include "attention/ops/cuda_scan_queries.h"
#include "attention/ops/cuda_scan_row.h"

namespace darkformer::cuda_scan {

// [v_j, 1] of positions [pos, pos + sl) into c.vh.
DF_HD inline void LoadValues(const Block& b, const Row& r, int64_t pos, int64_t sl, const Scratch& c) {
  const int64_t v = r.value_dim + 1;
  ParallelLoad(
      b, sl * v,
      [&](int64_t idx) {
        const int64_t j = idx / v, k = idx % v;
        return k < r.value_dim ? LoadAsFloat(r.v, r.v_bf16, (pos + j) * r.v_pos + k * r.v_dim) : 1.0f;
      },
      [&](int64_t idx, float x) { c.vh[idx] = x; });
}

// Per query t of the sub-chunk [pos, pos + sl): the last document start in [pos, pos + t], relative
// to pos, or -1 (t's document began before the sub-chunk) into c.starts (small integers, exact).
// A thread walks back kStageBatch positions at a time, their ids read before any is compared: one
// memory latency a batch, where a walk that stopped at each start's test waited on every read.
DF_HD inline void DocumentStarts(const Block& b, const Row& r, int64_t pos, int64_t sl, const Scratch& c) {
  ParallelFor(b, sl, [&](int64_t t) {
    int64_t start = -1;
    for (int64_t j0 = t; j0 >= 0 && start < 0; j0 -= kStageBatch) {
      bool starts[kStageBatch];
      DF_UNROLL for (int k = 0; k < kStageBatch; ++k) starts[k] = j0 - k >= 0 && r.StartsAt(pos + j0 - k);
      DF_UNROLL for (int k = 0; k < kStageBatch; ++k) start = start < 0 && starts[k] ? j0 - k : start;
    }
    c.starts[t] = static_cast<float>(start);
  });
}

// Query t's first key in the sub-chunk, and whether it reads the entering state (has: one exists).
DF_HD inline int64_t FirstKey(const Scratch& c, int64_t t) { return c.starts[t] < 0 ? 0 : static_cast<int64_t>(c.starts[t]); }
DF_HD inline bool ReadsState(const Scratch& c, int64_t t, bool has) { return has && c.starts[t] < 0; }
// Whether a document starts inside the sub-chunk (c.starts of its last query).
DF_HD inline bool HoldsStart(const Scratch& c, int64_t sl) { return c.starts[sl - 1] >= 0; }

// The log-features of the sub-chunk at pos, after its Maxima (sl x m).
DF_HD inline const float* KeysOf(const Row& r, int64_t pos, const Scratch& c) {
  return KeysAt(r.keys, r.features, pos, c.ka);
}

// The growth of a feature's running max inside a sub-chunk beyond which its pairs with later
// queries are not taken as products (FactoredQueries): 2^64 then bounds a key's factor.
constexpr float kMaxPairGrowth = 64.0f;
// Threads that share a query's shift s_t (Maxima).
constexpr int64_t kShiftParts = 4;

// c.starts for the sub-chunk [pos, pos + sl), its keys' features (c.ka where the scan projects them:
// KeysOf reads them until the next sub-chunk's Maxima), then R at each of its positions (c.rrows,
// sl x m) from the entering reference (has: a state exists; R restarts at a document start) and the keys; with
// queries, their features into c.qa and their shifts s_t = max_i (a_ti + R_i(t)) into c.s2
// (head-major, G x sl).
DF_HD inline void Maxima(const Block& b, const Row& r, int64_t pos, int64_t sl, bool queries, const float* ref, bool has,
                         const Scratch& c) {
  const int64_t m = r.features;
  ProjectKeys(b, r.keys, r.tensor_cores, m, pos, sl, c.ka);
  const float* l = KeysOf(r, pos, c);
  DocumentStarts(b, r, pos, sl, c);
  // A feature's walk over the positions reads kStageBatch keys ahead of its writes (each write of
  // c.rrows might, for all the compiler knows, be what the next read reads: one latency a step).
  ParallelFor(b, m, [&](int64_t i) {
    float running = has ? ref[i] : kNegInf, first = 0.0f;
    int64_t grown = sl;  // the first position where R_i has grown past kMaxPairGrowth (FactoredQueries)
    for (int64_t j0 = 0; j0 < sl; j0 += kStageBatch) {
      float key[kStageBatch], start[kStageBatch];
      DF_UNROLL for (int k = 0; k < kStageBatch; ++k) {
        key[k] = j0 + k < sl ? l[(j0 + k) * m + i] : 0.0f;
        start[k] = j0 + k < sl ? c.starts[j0 + k] : -1.0f;
      }
      DF_UNROLL for (int k = 0; k < kStageBatch; ++k) {
        const int64_t j = j0 + k;
        if (j >= sl) break;
        const bool restart = (j == 0 && !has) || start[k] == static_cast<float>(j);
        running = restart ? key[k] : Max(running, key[k]);
        c.rrows[j * m + i] = running;
        first = j == 0 ? running : first;
        grown = grown == sl && !(running - first <= kMaxPairGrowth) ? j : grown;  // NaN: grown
      }
    }
    c.decay[i] = static_cast<float>(grown);
  });
  if (!queries) return;
  QueryFeatures(b, r.queries, r.tensor_cores, m, r.group, pos, sl, c.qa);
  // s_t over kShiftParts threads a query, each a run of features, their maxima in c.n (free until
  // the numerators), then combined: G S queries alone would leave most of a block idle at S = 8
  // (64 of 256 threads), each walking all m features. A max is exact: the same s_t either way, in
  // any order. So each thread walks its run from its lane on (WalkFromLane): a warp's 32 rows lie m
  // floats apart, and walked in step they would read one bank of shared memory at a time (32-way).
  const int64_t gs = r.group * sl, v = r.value_dim + 1, parts = v < kShiftParts ? v : kShiftParts;
  const int64_t run = (m + parts - 1) / parts;
  ParallelFor(b, gs * parts, [&](int64_t idx) {
    const int64_t ht = idx / parts, first = (idx % parts) * run, last = first + run < m ? first + run : m;
    const float* q = c.qa + ht * m;
    const float* rt = c.rrows + (ht % sl) * m;
    float best = kNegInf;
    WalkFromLane(idx % 32, first, last, [&](int64_t i) { best = Max(best, q[i] + rt[i]); });
    c.n[idx] = best;
  });
  ParallelFor(b, gs, [&](int64_t ht) {
    float best = kNegInf;
    for (int64_t p = 0; p < parts; ++p) best = Max(best, c.n[ht * parts + p]);
    c.s2[ht] = best;
  });
}

// 2^((a_ti + R_i(e')) - s_t), the factor by which query ht of the sub-chunk (G sl, head-major)
// reads a state at `ref` in feature i; 0 where its document starts inside the sub-chunk. c.qa and
// c.s2 must hold the sub-chunk's (Maxima). Computed in an epilogue, or once for a product's A
// operand (StateReadFactors).
DF_HD inline float StateReadFactor(const Row& r, int64_t sl, const float* ref, const Scratch& c, int64_t ht,
                                   int64_t i) {
  return ReadsState(c, ht % sl, true) ? DF_EXP2((c.qa[ht * r.features + i] + ref[i]) - c.s2[ht]) : 0.0f;
}

// Every StateReadFactor of the sub-chunk into qc (G sl x m), for a product that reads them as its
// A operand: a product stages A again for each panel of its columns (4 at Dv + 1 = 257, and the
// normaliser's column once more by thread), so computed there each cost 5 exponentials. No scratch
// of its own: qc is c.qa itself where nothing reads the features after (the forward's numerators),
// or c.da before the backward writes it.
DF_HD inline void StateReadFactors(const Block& b, const Row& r, int64_t sl, const float* ref, const Scratch& c,
                                   float* qc) {
  const int64_t m = r.features;
  ParallelFor(b, r.group * sl * m, [&](int64_t idx) { qc[idx] = StateReadFactor(r, sl, ref, c, idx / m, idx % m); });
}

// c.kk = 2^(l_j - R(end)) for the sub-chunk's keys in its last document, R(end) its last position's
// maxima; 0 for keys before that document's start (no later query sees them).
DF_HD inline void KeysAtEnd(const Block& b, const Row& r, const float* l, int64_t sl, const Scratch& c) {
  const int64_t m = r.features, first = FirstKey(c, sl - 1);
  const float* end = c.rrows + (sl - 1) * m;
  ParallelFor(b, sl * m, [&](int64_t idx) { c.kk[idx] = idx / m >= first ? DF_EXP2(l[idx] - end[idx % m]) : 0.0f; });
}

// A sub-chunk's own pairs e_tj,i = 2^((a_ti + l_ji) - s_t) factor as qe_ti ke_ji with qe_ti =
// 2^((a_ti + R_i(0)) - s_t) <= 1 (PairQueryFactor; s_t >= a_ti + R_i(t) >= a_ti + R_i(0)) and
// ke_ji = 2^(l_ji - R_i(0)) (PairKeyFactors), R(0) the running max at its first position, which
// no later token moves. So w = qe ke^T and the backward's da and dl are matrix products (tensor
// cores) instead of (S + 1) / 2 exponentials per query, key and feature, for the queries t < T:
// T, the first position past 0 where a document starts or a feature's max has grown past
// kMaxPairGrowth, so ke_ji <= 2^(R_i(j) - R_i(0)) <= 2^64 for every key j < T (no overflow),
// and a pair lost to qe's underflow is below 2^-85 of a normaliser >= 1. T depends on the keys
// up to it only, so a query's output never reads a later token, the choice of its path included;
// the queries from T on take the exponentials, pair by pair. The pair attaining s_t is then
// qe ke ~ 1, not an exact 1. Every thread gets T; c.rrows, c.starts and c.decay (each feature's
// first grown position) must hold the sub-chunk's (Maxima). 0 where the kernel asks for
// exponentials throughout (its key `pairs`: Row::factor_pairs).
DF_HD inline int64_t FactoredQueries(const Block& b, const Row& r, int64_t sl, const Scratch& c) {
  if (!r.factor_pairs) return 0;
  return MinOf(b, sl + r.features, sl, [&](int64_t k) {
    return k < sl ? (c.starts[k] > 0.0f ? k : sl) : static_cast<int64_t>(c.decay[k - sl]);
  });
}

// qe_ti of query ht (G sl, head-major) in feature i (FactoredQueries).
DF_HD inline float PairQueryFactor(const Row& r, const Scratch& c, int64_t ht, int64_t i) {
  return DF_EXP2((c.qa[ht * r.features + i] + c.rrows[i]) - c.s2[ht]);
}

// c.kk = ke_j = 2^(l_j - R(0)) for the sub-chunk's keys j < T (FactoredQueries), 0 for the rest.
DF_HD inline void PairKeyFactors(const Block& b, const Row& r, const float* l, int64_t sl, int64_t factored,
                                 const Scratch& c) {
  const int64_t m = r.features;
  ParallelFor(b, sl * m, [&](int64_t idx) { c.kk[idx] = idx / m < factored ? DF_EXP2(l[idx] - c.rrows[idx % m]) : 0.0f; });
}

// Folds the sub-chunk's keys l and c.vh into state/ref (has: a state exists): rows whose max grew
// decay by 2^(R_old - R_new) <= 1, the keys join at R_new. c.rrows and c.starts must hold the
// sub-chunk's (Maxima); from a document start inside it, only its last document's keys remain.
DF_HD inline void Fold(const Block& b, const Row& r, const float* l, int64_t sl, float* state, float* ref, bool has,
                       const Scratch& c) {
  const int64_t m = r.features, v = r.value_dim + 1;
  const float* end = c.rrows + (sl - 1) * m;
  has = has && !HoldsStart(c, sl);
  KeysAtEnd(b, r, l, sl, c);
  ParallelFor(b, m, [&](int64_t i) { c.decay[i] = has ? DF_EXP2(ref[i] - end[i]) : 0.0f; });
  // state_ik = decay_i state_ik + sum_j kk_ji vh_jk.
  MatMul<Split::kBf16, Major::kCol>(
      b, r.tensor_cores, m, v, sl, [&](int64_t i, int64_t j) { return c.kk[j * m + i]; },
      [&](int64_t j, int64_t k) { return c.vh[j * v + k]; },
      Updating([&](int64_t i, int64_t k) { return state + i * v + k; },
               [&](int64_t i, int64_t, float old, float sum) { return (has ? old * c.decay[i] : 0.0f) + sum; },
               /*reads=*/has));
  ParallelFor(b, m, [&](int64_t i) { ref[i] = end[i]; });
}

// The numerators and normalisers n_t = sum_j e_tj [v_j, 1] of the G sl queries at pos into c.n
// (G sl x (Dv + 1)): the sub-chunk's own pairs w_tj = sum_i e_tj,i into c.w, and where a state
// exists (has) its read, StateReadFactor, against `state` at `ref`. c.vh (LoadValues),
// c.qa and c.s2 (Maxima) must hold the sub-chunk's; c.kk holds its keys' pair factors after
// (PairKeyFactors). The forward and the backward's query side both compute them here, in the same
// order, so the backward's are the forward's to the bit. The state-read factors go to qc (G sl x
// m: StateReadFactors; c.qa where nothing reads the features after). Returns T, the queries whose
// pairs factored (FactoredQueries).
DF_HD inline int64_t Numerators(const Block& b, const Row& r, int64_t pos, int64_t sl, const float* state,
                                const float* ref, bool has, const Scratch& c, float* qc) {
  const int64_t m = r.features, v = r.value_dim + 1, g = r.group;
  const float* l = KeysOf(r, pos, c);
  // The sub-chunk's own pairs: w_tj = sum_i 2^((a_ti + l_ji) - s_t), t's first key <= j <= t. For
  // t < T, w = qe ke^T (3xTF32, as the numerators it makes); from T on, the exponentials.
  const int64_t factored = FactoredQueries(b, r, sl, c);
  if (factored > 0) {
    PairKeyFactors(b, r, l, sl, factored, c);
    MatMul<Split::kTf32, Major::kRow, Major::kCol>(
        b, r.tensor_cores, g * sl, sl, m, [&](int64_t ht, int64_t i) { return PairQueryFactor(r, c, ht, i); },
        [&](int64_t i, int64_t j) { return c.kk[j * m + i]; },
        [&](int64_t ht, int64_t j, float sum) { c.w[ht * sl + j] = j <= ht % sl ? sum : 0.0f; });
  }
  if (factored < sl) {
    ParallelFor(b, g * sl * sl, [&](int64_t idx) {
      const int64_t ht = idx / sl, j = idx % sl, t = ht % sl;
      if (t < factored) return;
      float w = 0.0f;
      if (FirstKey(c, t) <= j && j <= t) {
        // The features from the thread's lane on: a warp's keys lie m floats apart, and summed in
        // step from feature 0 they would read one bank at a time (32-way at S = 64).
        const float* q = c.qa + ht * m;
        WalkFromLane(idx % 32, 0, m, [&](int64_t i) { w += DF_EXP2((q[i] + l[j * m + i]) - c.s2[ht]); });
      }
      c.w[idx] = w;
    });
  }
  // n_t = sum_j w_tj [v_j, 1] (w is 0 but for t's own pairs), then + sum_i qc_ti S_i (qc is 0 for
  // queries that do not read the state). 3xTF32: the backward's g . out cancels against them.
  MatMul<Split::kTf32>(
      b, r.tensor_cores, g * sl, v, sl, [&](int64_t ht, int64_t j) { return c.w[ht * sl + j]; },
      [&](int64_t j, int64_t kk) { return c.vh[j * v + kk]; },
      [&](int64_t ht, int64_t kk, float sum) { c.n[ht * v + kk] = sum; });
  if (has) {
    StateReadFactors(b, r, sl, ref, c, qc);
    MatMul<Split::kTf32>(
        b, r.tensor_cores, g * sl, v, m, [&](int64_t ht, int64_t i) { return qc[ht * m + i]; },
        [&](int64_t i, int64_t kk) { return state[i * v + kk]; },
        Updating([&](int64_t ht, int64_t kk) { return c.n + ht * v + kk; },
                 [](int64_t, int64_t, float old, float sum) { return old + sum; }));
  }
  return factored;
}

// Sub-chunk [pos, pos + sl) against `state` and its `ref` (has: one exists): its outputs and
// normalisers; then, with `fold`, the sub-chunk folded into them.
DF_HD inline void SubChunkForward(const Block& b, const Row& r, const ForwardOut& o, int64_t pos, int64_t sl,
                                  float* state, float* ref, bool has, bool fold, const Scratch& c) {
  const int64_t v = r.value_dim + 1, dv = r.value_dim, g = r.group;
  LoadValues(b, r, pos, sl, c);
  Maxima(b, r, pos, sl, /*queries=*/true, ref, has, c);
  Numerators(b, r, pos, sl, state, ref, has, c, /*qc=*/c.qa);  // the features' last reader
  ParallelFor(b, g * sl * v, [&](int64_t idx) {
    const int64_t ht = idx / v, kk = idx % v, h = ht / sl, t = ht % sl;
    const float den = c.n[ht * v + dv];
    if (kk < dv) {
      const int64_t at = h * o.out_head_stride + (pos + t) * dv + kk;
      const float out = c.n[idx] / den;
      if (o.out16 != nullptr) {
        o.out16[at] = FloatToBf16(out);
      } else {
        o.out[at] = out;
      }
    } else {
      o.den[h * o.den_head_stride + pos + t] = den;
    }
  });
  if (fold) Fold(b, r, KeysOf(r, pos, c), sl, state, ref, has, c);
}

// The forward runs in three steps, the first and last with one block per (row, chunk): a chunk is
// the group_subs sub-chunks between two checkpoints.
DF_HD inline int64_t SubChunks(const Row& r) { return (r.length + r.sub - 1) / r.sub; }
DF_HD inline int64_t ChunkEnd(const Row& r, int64_t n) {
  const int64_t end = (n + 1) * r.group_subs, subs = SubChunks(r);
  return end < subs ? end : subs;
}

// 1. Chunk n's keys folded from an empty state: its own state and per-feature reference (the
// chunk's running max at its end), into `state` and `ref`, and into `reset` whether a document
// starts in the chunk (its own state then holds only the last document's keys).
DF_HD_INLINE void ChunkOwnState(const Block& b, const Row& r, int64_t n, float* state, float* ref, float* reset,
                                const Scratch& c) {
  bool has = false, starts = false;
  for (int64_t k = n * r.group_subs; k < ChunkEnd(r, n); ++k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    LoadValues(b, r, pos, sl, c);
    Maxima(b, r, pos, sl, /*queries=*/false, ref, has, c);
    starts = starts || HoldsStart(c, sl);  // every thread reads the same c.starts after the barrier
    Fold(b, r, KeysOf(r, pos, c), sl, state, ref, has, c);
    has = true;
  }
  ParallelFor(b, 1, [&](int64_t) { *reset = starts ? 1.0f : 0.0f; });
}

// 2. The states entering the chunks (EnteringStates, cuda_scan_chains.h).

// 3. Chunk n's outputs, from its checkpoint, folding its sub-chunks into it in place (nothing
// reads a checkpoint after the forward's last step).
DF_HD_INLINE void ChunkForward(const Block& b, const Row& r, const ForwardOut& o, int64_t n, const Scratch& c) {
  const int64_t m = r.features, mv = m * (r.value_dim + 1);
  float* state = o.states + (n - o.first) * mv;
  float* ref = o.refs + (n - o.first) * m;
  const int64_t end = ChunkEnd(r, n);
  for (int64_t k = n * r.group_subs; k < end; ++k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    SubChunkForward(b, r, o, pos, sl, state, ref, /*has=*/n > 0 || k > n * r.group_subs, /*fold=*/k + 1 < end, c);
  }
}

}  // namespace darkformer::cuda_scan
