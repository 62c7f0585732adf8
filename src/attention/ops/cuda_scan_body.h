// The CUDA operator's scan (op: cuda; cuda_scan.h), written once for two executors: a CUDA block
// (cuda_scan.cu) and one host thread that emulates it (cuda_scan_host.cpp), so the tests run the
// device's own arithmetic and indexing on a CPU. Every step is a loop whose iterations are
// independent (ParallelFor: the block's threads split it, then wait at a barrier); a step reads
// only what earlier steps wrote, so the emulation, which runs iterations one after another, computes
// what the block computes. Each sum runs in one thread in a fixed order: results are the same
// from run to run.
//
// The algorithm is the raw CPU kernel's (raw_cpu_kernel.h, per_feature_chunks.h) on base-2
// log-features computed outside (a_t for the G query heads that read a key row, l_j for its keys):
// sub-chunks of S positions; the state S_i = sum_j 2^(l_ji - R_i) [v_j, 1] per feature relative to
// its running max R_i; a query reads it with 2^((a_ti + R_i(e')) - s_t) <= 1, its own sub-chunk's
// keys pair by pair with 2^((a_ti + l_ji) - s_t), s_t = max_i (a_ti + R_i(t)), so the pair attaining
// s_t gives an exact 1 and the normaliser is >= 1. The backward is one reverse scan from
// checkpoints of the state every `group_subs` sub-chunks, as the CPU kernel's (cuda_scan_backward_body.h).
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

namespace darkformer::cuda_scan {

// The executor: a CUDA block (tid = threadIdx.x of size = blockDim.x), or one host thread (0 of 1).
struct Block {
  int tid = 0, size = 1;
  DF_HD void Sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

// f(i) for i in [0, n), split between the block's threads, then a barrier.
template <typename F>
DF_HD void ParallelFor(const Block& b, int64_t n, F f) {
  for (int64_t i = b.tid; i < n; i += b.size) f(i);
  b.Sync();
}

DF_HD inline float Max(float a, float b) { return a < b ? b : a; }
constexpr float kNegInf = -__builtin_huge_valf();

// One key row: its G query heads' a (head h at h * a_head_stride, L x m each), its keys' l (L x m)
// and values (L x Dv). Outputs and the backward's inputs per head likewise.
struct Row {
  int64_t length, features, value_dim, group, sub, group_subs;  // L, m, Dv, G, S, sub-chunks per checkpoint
  const float* a;
  int64_t a_head_stride;
  const float* l;
  const float* v;
};

struct ForwardOut {
  float* out;  // G x L x Dv
  int64_t out_head_stride;
  float* den;  // G x L, >= 1
  int64_t den_head_stride;
  float* states;  // checkpoints x m x V: the state before sub-chunks 0, group_subs, 2 group_subs, ...
  float* refs;    // checkpoints x m
};

struct BackwardIo {
  const float* states;
  const float* refs;
  const float* out;
  int64_t out_head_stride;
  const float* den;
  int64_t den_head_stride;
  const float* g;  // dL/dout, G x L x Dv
  int64_t g_head_stride;
  float* da;  // dL/d(natural-log a), G x L x m
  int64_t da_head_stride;
  float* dl;  // L x m
  float* dv;  // L x Dv
};

DF_HD inline int64_t CheckpointCount(int64_t length, int64_t sub, int64_t group_subs) {
  const int64_t subs = (length + sub - 1) / sub;
  return (subs + group_subs - 1) / group_subs;
}

// A row's working memory, carved from one buffer of ScratchFloats floats.
struct Scratch {
  float *state, *ref, *rrows, *s2, *qc, *w, *pw, *n, *kk, *decay, *vh;
  float *group_states = nullptr, *group_refs = nullptr, *group_has = nullptr, *h = nullptr, *da = nullptr,
        *dl = nullptr, *dvh = nullptr, *z = nullptr, *t = nullptr;

  // Forward-only (one block per chunk), or with the backward's buffers too (one block per row).
  DF_HD static int64_t Floats(int64_t m, int64_t dv, int64_t g, int64_t s, int64_t group_subs, bool backward) {
    const int64_t v = dv + 1, mv = m * v, gs = g * s;
    const int64_t forward = mv + m + s * m + gs + gs * m + 2 * gs * s + gs * v + s * m + m + s * v;
    return forward + (backward ? group_subs * (mv + m + 1) + gs * v + gs * m + s * m + s * v + 2 * mv : 0);
  }
  DF_HD static Scratch Carve(float* p, int64_t m, int64_t dv, int64_t g, int64_t s, int64_t group_subs, bool backward) {
    const int64_t v = dv + 1, mv = m * v, gs = g * s;
    Scratch c;
    auto take = [&p](int64_t n) {
      float* q = p;
      p += n;
      return q;
    };
    c.state = take(mv);
    c.ref = take(m);
    c.rrows = take(s * m);
    c.s2 = take(gs);
    c.qc = take(gs * m);
    c.w = take(gs * s);
    c.pw = take(gs * s);
    c.n = take(gs * v);
    c.kk = take(s * m);
    c.decay = take(m);
    c.vh = take(s * v);
    if (!backward) return c;
    c.group_states = take(group_subs * mv);
    c.group_refs = take(group_subs * m);
    c.group_has = take(group_subs);
    c.h = take(gs * v);
    c.da = take(gs * m);
    c.dl = take(s * m);
    c.dvh = take(s * v);
    c.z = take(mv);
    c.t = take(mv);
    return c;
  }
};

// [v_j, 1] of positions [pos, pos + sl) into c.vh.
DF_HD inline void LoadValues(const Block& b, const Row& r, int64_t pos, int64_t sl, const Scratch& c) {
  const int64_t v = r.value_dim + 1;
  ParallelFor(b, sl * v, [&](int64_t idx) {
    const int64_t j = idx / v, k = idx % v;
    c.vh[idx] = k < r.value_dim ? r.v[(pos + j) * r.value_dim + k] : 1.0f;
  });
}

// R at each position of the sub-chunk (c.rrows, sl x m) from the entering reference (has: a state
// exists) and the keys l (sl x m); with queries a (G heads at a_stride; nullptr: none), their
// shifts s_t = max_i (a_ti + R_i(t)) into c.s2 (head-major, G x sl).
DF_HD inline void Maxima(const Block& b, const Row& r, const float* l, const float* a, int64_t a_stride, int64_t sl,
                         const float* ref, bool has, const Scratch& c) {
  const int64_t m = r.features;
  ParallelFor(b, m, [&](int64_t i) {
    float running = has ? ref[i] : kNegInf;
    for (int64_t j = 0; j < sl; ++j) {
      running = (j == 0 && !has) ? l[i] : Max(running, l[j * m + i]);
      c.rrows[j * m + i] = running;
    }
  });
  if (a == nullptr) return;
  ParallelFor(b, r.group * sl, [&](int64_t ht) {
    const int64_t h = ht / sl, t = ht % sl;
    const float* q = a + h * a_stride + t * m;
    const float* rt = c.rrows + t * m;
    float best = kNegInf;
    for (int64_t i = 0; i < m; ++i) best = Max(best, q[i] + rt[i]);
    c.s2[ht] = best;
  });
}

// c.qc = 2^((a_ti + R_i(e')) - s_t) for the G sl queries.
DF_HD inline void StateReadFactors(const Block& b, const Row& r, const float* a, int64_t a_stride, int64_t sl,
                                   const float* ref, const Scratch& c) {
  const int64_t m = r.features;
  ParallelFor(b, r.group * sl * m, [&](int64_t idx) {
    const int64_t ht = idx / m, i = idx % m, h = ht / sl, t = ht % sl;
    c.qc[idx] = DF_EXP2((a[h * a_stride + t * m + i] + ref[i]) - c.s2[ht]);
  });
}

// c.kk = 2^(l_j - R(end)) for the sub-chunk's keys, R(end) its last position's maxima.
DF_HD inline void KeysAtEnd(const Block& b, const Row& r, const float* l, int64_t sl, const Scratch& c) {
  const int64_t m = r.features;
  const float* end = c.rrows + (sl - 1) * m;
  ParallelFor(b, sl * m, [&](int64_t idx) { c.kk[idx] = DF_EXP2(l[idx] - end[idx % m]); });
}

// Folds the sub-chunk's keys l and c.vh into state/ref (has: a state exists): rows whose max grew
// decay by 2^(R_old - R_new) <= 1, the keys join at R_new. c.rrows must hold the sub-chunk's maxima.
DF_HD inline void Fold(const Block& b, const Row& r, const float* l, int64_t sl, float* state, float* ref, bool has,
                       const Scratch& c) {
  const int64_t m = r.features, v = r.value_dim + 1;
  const float* end = c.rrows + (sl - 1) * m;
  KeysAtEnd(b, r, l, sl, c);
  ParallelFor(b, m, [&](int64_t i) { c.decay[i] = has ? DF_EXP2(ref[i] - end[i]) : 0.0f; });
  ParallelFor(b, m * v, [&](int64_t idx) {
    const int64_t i = idx / v, k = idx % v;
    float acc = has ? state[idx] * c.decay[i] : 0.0f;
    for (int64_t j = 0; j < sl; ++j) acc += c.kk[j * m + i] * c.vh[j * v + k];
    state[idx] = acc;
  });
  ParallelFor(b, m, [&](int64_t i) { ref[i] = end[i]; });
}

// Sub-chunk [pos, pos + sl) against the state in c (has: one exists): its outputs and
// normalisers; then, with `fold`, the sub-chunk folded into the state.
DF_HD inline void SubChunkForward(const Block& b, const Row& r, const ForwardOut& o, int64_t pos, int64_t sl, bool has,
                                  bool fold, const Scratch& c) {
  const int64_t m = r.features, v = r.value_dim + 1, dv = r.value_dim, g = r.group;
  const float* a = r.a + pos * m;
  const float* l = r.l + pos * m;
  LoadValues(b, r, pos, sl, c);
  Maxima(b, r, l, a, r.a_head_stride, sl, c.ref, has, c);
  // The sub-chunk's own pairs: w_tj = sum_i 2^((a_ti + l_ji) - s_t), j <= t.
  ParallelFor(b, g * sl * sl, [&](int64_t idx) {
    const int64_t ht = idx / sl, j = idx % sl, h = ht / sl, t = ht % sl;
    float w = 0.0f;
    if (j <= t) {
      const float* q = a + h * r.a_head_stride + t * m;
      for (int64_t i = 0; i < m; ++i) w += DF_EXP2((q[i] + l[j * m + i]) - c.s2[ht]);
    }
    c.w[idx] = w;
  });
  if (has) StateReadFactors(b, r, a, r.a_head_stride, sl, c.ref, c);
  // n_t = sum_{j <= t} w_tj [v_j, 1] + sum_i qc_ti S_i.
  ParallelFor(b, g * sl * v, [&](int64_t idx) {
    const int64_t ht = idx / v, kk = idx % v, t = ht % sl;
    float acc = 0.0f;
    for (int64_t j = 0; j <= t; ++j) acc += c.w[ht * sl + j] * c.vh[j * v + kk];
    if (has) {
      for (int64_t i = 0; i < m; ++i) acc += c.qc[ht * m + i] * c.state[i * v + kk];
    }
    c.n[idx] = acc;
  });
  ParallelFor(b, g * sl * v, [&](int64_t idx) {
    const int64_t ht = idx / v, kk = idx % v, h = ht / sl, t = ht % sl;
    const float den = c.n[ht * v + dv];
    if (kk < dv) {
      o.out[h * o.out_head_stride + (pos + t) * dv + kk] = c.n[idx] / den;
    } else {
      o.den[h * o.den_head_stride + pos + t] = den;
    }
  });
  if (fold) Fold(b, r, l, sl, c.state, c.ref, has, c);
}

// The forward runs in three steps, the first and last with one block per (row, chunk): a chunk is
// the group_subs sub-chunks between two checkpoints.
DF_HD inline int64_t SubChunks(const Row& r) { return (r.length + r.sub - 1) / r.sub; }
DF_HD inline int64_t ChunkEnd(const Row& r, int64_t n) {
  const int64_t end = (n + 1) * r.group_subs, subs = SubChunks(r);
  return end < subs ? end : subs;
}

// 1. Chunk n's keys folded from an empty state: its own state and per-feature reference (the
// chunk's running max at its end), into `state` and `ref`.
DF_HD inline void ChunkOwnState(const Block& b, const Row& r, int64_t n, float* state, float* ref, const Scratch& c) {
  bool has = false;
  for (int64_t k = n * r.group_subs; k < ChunkEnd(r, n); ++k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    LoadValues(b, r, pos, sl, c);
    Maxima(b, r, r.l + pos * r.features, nullptr, 0, sl, ref, has, c);
    Fold(b, r, r.l + pos * r.features, sl, state, ref, has, c);
    has = true;
  }
}

// 2. A row's checkpoints, the states entering its chunks: S_0 = 0 (reference -inf), and
// S_{n+1} = 2^(R_n - R) S_n + 2^(R'_n - R) S'_n with R = max(R_n, R'_n) per feature, S'_n chunk n's
// own state (step 1). Both factors <= 1 and the larger side's is exactly 1, so the key that
// attains a feature's max keeps its exact 1 in the normaliser. With `final_state` (a prefill: step 1
// ran for the last chunk too) also S_N, the state after the whole segment, and its reference.
DF_HD inline void EnteringStates(const Block& b, const Row& r, const float* own_states, const float* own_refs,
                                 const ForwardOut& o, const Scratch& c, float* final_state = nullptr,
                                 float* final_ref = nullptr) {
  const int64_t m = r.features, v = r.value_dim + 1, mv = m * v, chunks = CheckpointCount(r.length, r.sub, r.group_subs);
  ParallelFor(b, mv, [&](int64_t idx) { o.states[idx] = 0.0f; });
  ParallelFor(b, m, [&](int64_t i) { o.refs[i] = kNegInf; });
  for (int64_t n = 0; n + 1 < chunks || (final_state != nullptr && n < chunks); ++n) {
    const float *in = o.states + n * mv, *in_ref = o.refs + n * m, *own = own_states + n * mv, *own_ref = own_refs + n * m;
    const bool last = n + 1 == chunks;
    float* next = last ? final_state : o.states + (n + 1) * mv;
    float* next_ref = last ? final_ref : o.refs + (n + 1) * m;
    ParallelFor(b, m, [&](int64_t i) {
      const float top = Max(in_ref[i], own_ref[i]);
      c.decay[i] = DF_EXP2(in_ref[i] - top);  // 0 for the empty S_0
      c.ref[i] = DF_EXP2(own_ref[i] - top);
      next_ref[i] = top;
    });
    ParallelFor(b, mv, [&](int64_t idx) {
      const int64_t i = idx / v;
      next[idx] = c.decay[i] * in[idx] + c.ref[i] * own[idx];
    });
  }
}

// 3. Chunk n's outputs, from its checkpoint.
DF_HD inline void ChunkForward(const Block& b, const Row& r, const ForwardOut& o, int64_t n, const Scratch& c) {
  const int64_t m = r.features, mv = m * (r.value_dim + 1);
  ParallelFor(b, mv, [&](int64_t idx) { c.state[idx] = o.states[n * mv + idx]; });
  ParallelFor(b, m, [&](int64_t i) { c.ref[i] = o.refs[n * m + i]; });
  const int64_t end = ChunkEnd(r, n);
  for (int64_t k = n * r.group_subs; k < end; ++k) {
    const int64_t pos = k * r.sub, sl = r.sub < r.length - pos ? r.sub : r.length - pos;
    SubChunkForward(b, r, o, pos, sl, /*has=*/n > 0 || k > n * r.group_subs, /*fold=*/k + 1 < end, c);
  }
}

// A stretch of one key row scanned on its own from an empty state: the whole row, or one document
// of it (data.document_masking). Its chunks' checkpoints are slots first_chunk, first_chunk + 1, ...
// of the call's.
struct Segment {
  int64_t row = 0, start = 0, length = 0, first_chunk = 0;
};

// The key rows of one call. Rows are a KV head of a sequence, or a query head where key features
// are per query head. Row r's query heads are r * group ... r * group + group - 1 of the folded
// B * H heads; its values are row r / value_rows_per (H / K where keys are per query head, else 1).
// Every tensor fp32, each per-head block L contiguous rows.
struct Launch {
  int64_t rows = 0, length = 0, features = 0, value_dim = 0, group = 1, sub = 8, group_subs = 1;
  int64_t value_rows_per = 1;
  // The segments, in order of first_chunk; nullptr: each row whole (segment r = row r).
  const Segment* segments = nullptr;
  int64_t segment_count = 0, chunk_count = 0;  // chunk_count: checkpoints of all segments
  const float* a = nullptr;  // base-2 query log-features, rows x G x L x m
  const float* l = nullptr;  // base-2 key log-features, rows x L x m
  const float* v = nullptr;  // values, (rows / value_rows_per) x L x Dv
  // Forward.
  float* out = nullptr;         // rows x G x L x Dv
  float* den = nullptr;         // rows x G x L
  float* states = nullptr;      // chunk_count x m x (Dv + 1): the state entering each chunk
  float* refs = nullptr;        // chunk_count x m
  float* own_states = nullptr;  // chunk_count x m x (Dv + 1): each chunk's own state
  float* own_refs = nullptr;    // chunk_count x m
  // Backward (reads out, den, states, refs too).
  const float* g = nullptr;  // dL/dout, rows x G x L x Dv
  float* da = nullptr;       // rows x G x L x m, d/d(natural-log a)
  float* dl = nullptr;       // rows x L x m
  float* dv = nullptr;       // rows x L x Dv (the caller sums value_rows_per rows)
  float* z_own = nullptr;    // chunk_count x m x (Dv + 1): each chunk's own share of the reverse state
  float* z_out = nullptr;    // chunk_count x m x (Dv + 1): the reverse state at each chunk's end
  // The backward's blocks per segment (each takes every W-th chunk): its scratch, W blocks' worth
  // per segment, stays bounded however long the sequence.
  int64_t backward_blocks = 1;
  // Forward: chunk_count x ScratchFloats(false), one per chunk's block; backward:
  // segment_count x backward_blocks x ScratchFloats(true).
  float* scratch = nullptr;

  DF_HD int64_t Chunks(const Segment& s) const { return CheckpointCount(s.length, sub, group_subs); }
  DF_HD Segment SegmentAt(int64_t i) const {
    if (segments != nullptr) return segments[i];
    return {i, 0, length, i * CheckpointCount(length, sub, group_subs)};
  }
  // The segment that holds call-wide chunk `chunk`.
  DF_HD int64_t SegmentOfChunk(int64_t chunk) const {
    if (segments == nullptr) return chunk / CheckpointCount(length, sub, group_subs);
    int64_t lo = 0, hi = segment_count - 1;  // the last segment whose first_chunk <= chunk
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (segments[mid].first_chunk <= chunk) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  DF_HD int64_t ScratchFloats(bool backward) const {
    return Scratch::Floats(features, value_dim, group, sub, group_subs, backward);
  }
  DF_HD Scratch ScratchOf(int64_t block, bool backward) const {
    return Scratch::Carve(scratch + block * ScratchFloats(backward), features, value_dim, group, sub, group_subs,
                          backward);
  }

  // A segment's view of the call's tensors.
  DF_HD Row RowOf(const Segment& s) const {
    const int64_t lm = length * features;
    return {s.length, features, value_dim, group, sub, group_subs, a + s.row * group * lm + s.start * features, lm,
            l + s.row * lm + s.start * features, v + (s.row / value_rows_per) * length * value_dim + s.start * value_dim};
  }
  DF_HD ForwardOut ForwardOf(const Segment& s) const {
    const int64_t ld = length * value_dim, mv = features * (value_dim + 1);
    return {out + s.row * group * ld + s.start * value_dim, ld, den + s.row * group * length + s.start, length,
            states + s.first_chunk * mv, refs + s.first_chunk * features};
  }
  DF_HD BackwardIo BackwardOf(const Segment& s) const {
    const int64_t ld = length * value_dim, lm = length * features, mv = features * (value_dim + 1);
    return {states + s.first_chunk * mv, refs + s.first_chunk * features,
            out + s.row * group * ld + s.start * value_dim, ld, den + s.row * group * length + s.start, length,
            g + s.row * group * ld + s.start * value_dim, ld, da + s.row * group * lm + s.start * features, lm,
            dl + s.row * lm + s.start * features, dv + s.row * ld + s.start * value_dim};
  }
  DF_HD float* OwnStateOf(const Segment& s) const { return own_states + s.first_chunk * features * (value_dim + 1); }
  DF_HD float* OwnRefOf(const Segment& s) const { return own_refs + s.first_chunk * features; }
  DF_HD float* ZOwnOf(const Segment& s) const { return z_own + s.first_chunk * features * (value_dim + 1); }
  DF_HD float* ZOutOf(const Segment& s) const { return z_out + s.first_chunk * features * (value_dim + 1); }
};

}  // namespace darkformer::cuda_scan
