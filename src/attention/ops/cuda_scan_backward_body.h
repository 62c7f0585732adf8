// The CUDA operator's scan, backward (see cuda_scan_body.h: the same two executors, the same
// rules for a step).
#pragma once

#include "attention/ops/cuda_scan_body.h"

namespace darkformer::cuda_scan {

// h_t = dL/dn_t = [g_t / den_t, -(g_t . out_t) / den_t] for the G sl queries at pos, into c.h.
// The query side (`numerators`: c.n holds the sub-chunk's, Numerators) forms g_t . out_t from
// out_t = n_t / den_t in fp32, as the forward formed the output, and writes it to io.dot; the key
// side reads it there. So autograd keeps no fp32 output: its bf16 rounding would break the
// parameters' fp32 rule where g . v_j - g . out cancels (sharp rows). The incoming gradient is
// read once, coalesced and in batches (ParallelLoad), into c.h; the dot then reads it there, over
// kShiftParts threads a query, each a run of the value dims, their sums in c.da (free between the
// numerators and the da products) added in order after, as each h is scaled: a thread a query
// would walk all Dv dims, a division each, while most of the block idles, and each part reading g
// from global memory a step at a time waited on a load a step.
DF_HD inline void Cotangents(const Block& b, const Row& r, const BackwardIo& io, int64_t pos, int64_t sl,
                             bool numerators, const Scratch& c) {
  const int64_t v = r.value_dim + 1, dv = r.value_dim, gs = r.group * sl;
  auto at_of = [&](int64_t ht) { return (ht / sl) * io.den_head_stride + pos + ht % sl; };
  auto g_of = [&](int64_t idx) {
    const int64_t ht = idx / v, kk = idx % v;
    return LoadAsFloat(io.g, io.g_bf16, (ht / sl) * io.g_head_stride + (pos + ht % sl) * io.g_pos + kk * io.g_dim);
  };
  if (!numerators) {
    ParallelLoad(
        b, gs * v,
        [&](int64_t idx) {
          const int64_t at = at_of(idx / v);
          const float inv = 1.0f / io.den[at];
          return idx % v < dv ? g_of(idx) * inv : -io.dot[at] * inv;
        },
        [&](int64_t idx, float x) { c.h[idx] = x; });
    return;
  }
  // g into c.h (its normaliser column after the dot, below).
  ParallelLoad(
      b, gs * v, [&](int64_t idx) { return idx % v < dv ? g_of(idx) : 0.0f; }, [&](int64_t idx, float x) { c.h[idx] = x; });
  const int64_t most = dv < r.features ? dv : r.features, parts = most < kShiftParts ? most : kShiftParts;
  const int64_t run = (dv + parts - 1) / parts;
  ParallelFor(b, gs * parts, [&](int64_t idx) {
    const int64_t ht = idx / parts, first = (idx % parts) * run, last = first + run < dv ? first + run : dv;
    const float* n = c.n + ht * v;
    const float* g = c.h + ht * v;
    float dot = 0.0f;
    for (int64_t q = first; q < last; ++q) dot += g[q] * (n[q] / n[dv]);
    c.da[idx] = dot;
  });
  ParallelFor(b, gs * v, [&](int64_t idx) {
    const int64_t ht = idx / v, at = at_of(ht);
    const float inv = 1.0f / io.den[at];
    if (idx % v < dv) {
      c.h[idx] = c.h[idx] * inv;
      return;
    }
    float dot = 0.0f;
    for (int64_t p = 0; p < parts; ++p) dot += c.da[ht * parts + p];
    io.dot[at] = dot;
    c.h[idx] = -dot * inv;
  });
}

// A dv term into its element: added to the value row's shared zeros (io.dv_shared), else the row's
// own, its first term (the query side's) written and the key side's added.
DF_HD inline void StoreDv(const BackwardIo& io, float* to, float sum, bool first) {
  if (io.dv_shared) {
    AddShared(to, sum);
  } else {
    *to = first ? sum : *to + sum;
  }
}

// The sub-chunk's own pairs by exponentials, e_tj,i = 2^((a_ti + l_ji) - s_t) times pw_tj, for the
// queries t >= T (FactoredQueries): da of those queries (c.da), and their share of every key's dl,
// added to what the products left (io.dl; where T is 0, written).
DF_HD inline void PairsByExponentials(const Block& b, const Row& r, const BackwardIo& io, int64_t pos, int64_t sl,
                                      const float* l, int64_t factored, const Scratch& c) {
  const int64_t m = r.features, g = r.group;
  ParallelFor(b, g * sl * m, [&](int64_t idx) {
    const int64_t ht = idx / m, i = idx % m, t = ht % sl;
    if (t < factored) return;
    const float q = c.qa[idx];
    float acc = 0.0f;
    for (int64_t j = FirstKey(c, t); j <= t; ++j) acc += c.pw[ht * sl + j] * DF_EXP2((q + l[j * m + i]) - c.s2[ht]);
    c.da[idx] = acc;
  });
  ParallelFor(b, sl * m, [&](int64_t idx) {
    const int64_t j = idx / m, i = idx % m;
    float acc = 0.0f;
    for (int64_t h = 0; h < g; ++h) {
      for (int64_t t = j > factored ? j : factored; t < sl; ++t) {
        const int64_t ht = h * sl + t;
        if (FirstKey(c, t) > j) continue;  // t's document starts after key j
        acc += c.pw[ht * sl + j] * DF_EXP2((c.qa[ht * m + i] + l[idx]) - c.s2[ht]);
      }
    }
    io.dl[pos * m + idx] = factored > 0 ? io.dl[pos * m + idx] + acc : acc;
  });
}

// The backward's terms of sub-chunk [pos, pos + sl) that read its entering `state` (at `ref`;
// has: one exists) or only its own keys: da_t in full, and the first terms of dl_j and dv_j (the
// key side adds the later queries' share). c.rrows and c.starts are left as Maxima's, for the fold
// that follows.
DF_HD_INLINE void QuerySideGradients(const Block& b, const Row& r, const BackwardIo& io, int64_t pos, int64_t sl,
                                     const float* state, const float* ref, bool has, const Scratch& c) {
  const int64_t m = r.features, v = r.value_dim + 1, dv = r.value_dim, g = r.group;
  LoadValues(b, r, pos, sl, c);
  Maxima(b, r, pos, sl, /*queries=*/true, ref, has, c);
  const float* l = KeysOf(r, pos, c);
  // The forward's numerators again (c.n; c.w holds w_tj = sum_i e_tj,i), and T, the queries whose
  // pairs factor (FactoredQueries: c.kk holds the keys' factors).
  const int64_t factored = Numerators(b, r, pos, sl, state, ref, has, c, /*qc=*/c.da);  // da is written after
  Cotangents(b, r, io, pos, sl, /*numerators=*/true, c);
  // Per pair (j <= t): pw = h_t . [v_j, 1], 0 off t's own pairs. A product (G sl x sl, Dv + 1
  // deep) in 3xTF32: g . v_j cancels against g . out_t on sharp rows, as in S h. By thread it was
  // a Dv + 1 walk per pair, 16 pairs a thread at S = 64.
  MatMul<Split::kTf32, Major::kRow, Major::kCol>(
      b, r.tensor_cores, g * sl, sl, v, [&](int64_t ht, int64_t kk) { return c.h[ht * v + kk]; },
      [&](int64_t kk, int64_t j) { return c.vh[j * v + kk]; },
      [&](int64_t ht, int64_t j, float sum) {
        const int64_t t = ht % sl;
        c.pw[ht * sl + j] = FirstKey(c, t) <= j && j <= t ? sum : 0.0f;
      });
  // The sub-chunk's own pairs into da (per query) and dl (per key), and dv. For the queries t < T,
  // da_ti = qe_ti sum_j pw_tj ke_ji and their share of dl_ji = ke_ji sum_t pw_tj qe_ti (pw is 0 but
  // for t's own pairs; ke is 0 from T on), two products in 3xTF32 (pw cancels on sharp rows, as
  // S h does); from T on, the exponentials.
  if (factored > 0) {
    MatMul<Split::kTf32>(
        b, r.tensor_cores, g * sl, m, sl, [&](int64_t ht, int64_t j) { return c.pw[ht * sl + j]; },
        [&](int64_t j, int64_t i) { return c.kk[j * m + i]; },
        [&](int64_t ht, int64_t i, float sum) {
          if (ht % sl < factored) c.da[ht * m + i] = PairQueryFactor(r, c, ht, i) * sum;
        });
    MatMul<Split::kTf32, Major::kCol>(
        b, r.tensor_cores, sl, m, g * sl,
        [&](int64_t j, int64_t ht) { return ht % sl < factored ? c.pw[ht * sl + j] : 0.0f; },
        [&](int64_t ht, int64_t i) { return ht % sl < factored ? PairQueryFactor(r, c, ht, i) : 0.0f; },
        [&](int64_t j, int64_t i, float sum) { io.dl[(pos + j) * m + i] = c.kk[j * m + i] * sum; });
  }
  if (factored < sl) PairsByExponentials(b, r, io, pos, sl, l, factored, c);
  // dv_j = sum_t w_tj h_t (w is 0 but for t's own pairs).
  MatMul<Split::kBf16, Major::kCol>(
      b, r.tensor_cores, sl, dv, g * sl, [&](int64_t j, int64_t ht) { return c.w[ht * sl + j]; },
      [&](int64_t ht, int64_t kk) { return c.h[ht * v + kk]; },
      [&](int64_t j, int64_t kk, float sum) { StoreDv(io, io.dv + (pos + j) * dv + kk, sum, /*first=*/true); });
  // da_t += qc_t * (S h_t), qc = StateReadFactor (0 for queries whose document starts here). 3xTF32:
  // S h cancels on sharp rows (cuda_scan_matmul.h); the dv products above and below take bf16x3.
  if (has) {
    MatMul<Split::kTf32, Major::kRow, Major::kCol>(
        b, r.tensor_cores, g * sl, m, v, [&](int64_t ht, int64_t kk) { return c.h[ht * v + kk]; },
        [&](int64_t kk, int64_t i) { return state[i * v + kk]; },
        Updating([&](int64_t ht, int64_t i) { return c.da + ht * m + i; },
                 [&](int64_t ht, int64_t i, float old, float sum) {
                   return old + StateReadFactor(r, sl, ref, c, ht, i) * sum;
                 }));
  }
  // The exponentials are the same numbers in base e, so the sums are the natural-log gradients.
  QueryGradients(b, r.queries, r.tensor_cores, m, g, pos, sl, c.da, io.dq, io.dq_head_stride);
}

// The backward of a chunk (raw_cpu_kernel.cpp's RunPositiveRowBackward): for query t and key j
// of a sub-chunk, h_t = dL/dn_t = [g_t / den_t, -(g_t . out_t) / den_t],
//   dL/da_t = qc_t * (S(e') h_t) + sum_{j <= t} e_tj (h_t . [v_j, 1])
//   dL/dl_j = 2^(l_j - R(f)) * (Z [v_j, 1]) + sum_{t >= j} e_tj (h_t . [v_j, 1])
//   dL/d[v_j, 1] = 2^(l_j - R(f)) Z + sum_{t >= j} w_tj h_t
// with e_tj = 2^((a_t + l_j) - s_t) per feature and Z the reverse state at R(f): the later
// queries' sums T = sum_t 2^((a_t + R(e')) - s_t) h_t^T, each brought to R(f) (Z_prev = T +
// 2^(R(e') - R(f)) Z). Documents as in cuda_scan_body.h: a pair, a state read or a key's share of Z
// across a document start is skipped (a select), and Z does not pass back over a sub-chunk that
// holds a start.
//
// Two passes, each its own launch, so the states entering the chunks and the reverse states are
// never held at once:
// - the query side, forward from the chunk's checkpoint, folding its sub-chunks into it in place:
//   the terms that read the entering state S(e') and the sub-chunks' own pairs: da in full, and
//   the first terms of dl and dv;
// - the key side, in reverse from Z at the chunk's end: the terms that read Z, added to dl and dv,
//   and Z itself, which needs only the sub-chunks' references, not their states.

// The row's sub-chunk k's entering reference (m floats), as the query side leaves it for the key side.
DF_HD inline float* SubChunkRef(const Row& r, const BackwardIo& io, int64_t k) {
  return io.sub_refs + (k - io.first * r.group_subs) * r.features;
}

// The query side of chunk n: its checkpoint (io.states, consumed: folded in place) read by each
// sub-chunk's queries, and each sub-chunk's own pairs. Each sub-chunk's entering reference is left
// in io.sub_refs for the key side, which would otherwise rerun the chunk's maxima to find them.
DF_HD_INLINE void ChunkQuerySide(const Block& b, const Row& r, const BackwardIo& io, int64_t n, const Scratch& c) {
  const int64_t m = r.features, mv = m * (r.value_dim + 1), first = n * r.group_subs, end = ChunkEnd(r, n);
  float* state = io.states + (n - io.first) * mv;
  float* ref = c.group_ref;  // the current sub-chunk's entering reference (the checkpoint's is kept)
  ParallelFor(b, m, [&](int64_t i) { ref[i] = io.refs[(n - io.first) * m + i]; });
  for (int64_t k = first; k < end; ++k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    const bool has = n > 0 || k > first;
    float* kept = SubChunkRef(r, io, k);
    ParallelFor(b, m, [&](int64_t i) { kept[i] = ref[i]; });
    QuerySideGradients(b, r, io, pos, sl, state, ref, has, c);
    if (k + 1 < end) Fold(b, r, KeysOf(r, pos, c), sl, state, ref, has, c);
  }
}

// The key side of chunk n, from `z`: the reverse state at the chunk's end (has_z; else none),
// updated in place to the chunk's own start. With `gradients`, the terms of dl and dv that read it
// are added; without, z ends as the chunk's own share of the reverse state at its entering
// reference (step 1 of the reverse scan; ReverseStates is step 2). The sub-chunks' entering
// references are the query side's (io.sub_refs).
DF_HD_INLINE void ChunkKeySide(const Block& b, const Row& r, const BackwardIo& io, int64_t n, float* z, bool has_z,
                               bool gradients, const Scratch& c) {
  const int64_t m = r.features, v = r.value_dim + 1, dv = r.value_dim, g = r.group;
  const int64_t first = n * r.group_subs, end = ChunkEnd(r, n);
  for (int64_t k = end - 1; k >= first; --k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    const float* ref = SubChunkRef(r, io, k);
    const bool has_in = n > 0 || k > first;  // a state enters it
    if (gradients) LoadValues(b, r, pos, sl, c);
    Maxima(b, r, pos, sl, /*queries=*/true, ref, has_in, c);
    const float* l = KeysOf(r, pos, c);
    const bool holds_start = HoldsStart(c, sl);  // the same for every thread after the barrier
    // Keys and values against the later sub-chunks' queries (the reverse state Z at R(f)).
    if (gradients && has_z) {
      KeysAtEnd(b, r, l, sl, c);
      // dl_j += kk_j * (Z [v_j, 1]) (3xTF32: Z [v_j, 1] cancels); dv_j += kk_j Z.
      MatMul<Split::kTf32, Major::kRow, Major::kCol>(
          b, r.tensor_cores, sl, m, v, [&](int64_t j, int64_t kk) { return c.vh[j * v + kk]; },
          [&](int64_t kk, int64_t i) { return z[i * v + kk]; },
          Updating([&](int64_t j, int64_t i) { return io.dl + (pos + j) * m + i; },
                   [&](int64_t j, int64_t i, float old, float sum) { return old + c.kk[j * m + i] * sum; }));
      MatMul<Split::kBf16>(
          b, r.tensor_cores, sl, dv, m, [&](int64_t j, int64_t i) { return c.kk[j * m + i]; },
          [&](int64_t i, int64_t kk) { return z[i * v + kk]; },
          [&](int64_t j, int64_t kk, float sum) {
            StoreDv(io, io.dv + (pos + j) * dv + kk, sum, /*first=*/false);
          });
    }
    if (!has_in) break;  // the row's first sub-chunk
    // Z for the sub-chunk before, at its R: T + 2^(R(e') - R(f)) Z with T = sum_t qc_t h_t^T; T
    // alone where a document starts in this sub-chunk (no later query sees an earlier key). In
    // 3xTF32, as Z [v_j, 1] reads it.
    Cotangents(b, r, io, pos, sl, /*numerators=*/false, c);
    const float* end_r = c.rrows + (sl - 1) * m;
    const bool had_z = has_z && !holds_start;
    StateReadFactors(b, r, sl, ref, c, c.da);  // the key side writes no da
    MatMul<Split::kTf32, Major::kCol>(
        b, r.tensor_cores, m, v, g * sl, [&](int64_t i, int64_t ht) { return c.da[ht * m + i]; },
        [&](int64_t ht, int64_t kk) { return c.h[ht * v + kk]; },
        Updating([&](int64_t i, int64_t kk) { return z + i * v + kk; },
                 [&](int64_t i, int64_t, float old, float sum) {
                   return had_z ? sum + DF_EXP2(ref[i] - end_r[i]) * old : sum;
                 },
                 /*reads=*/had_z));
    has_z = true;
  }
}

// Step 2, the reverse states (ReverseStates), is cuda_scan_chains.h's.

}  // namespace darkformer::cuda_scan
