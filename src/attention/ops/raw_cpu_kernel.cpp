// The fused operator's raw fp32 CPU kernel for positive features (see raw_cpu_kernel.h). All logs
// are base 2: a_t = x_t W^T log2(e) (a query's own -|x|^2/2 - log(m)/2 shifts all its arguments,
// s_t's too, and cancels), l_j = (y_j W^T - |y_j|^2/2) log2(e) (every key's -log(m)/2 cancels),
// R_i(t) = max_{j <= t} l_ji and s_t = max_i (a_ti + R_i(t)). For t in a sub-chunk whose keys
// before it live in the state (S_i relative to R_i at the previous sub-chunk's end, e'):
//   n_t = sum_i 2^((a_ti + R_i(e')) - s_t) S_i  +  sum_{j <= t in the sub-chunk} sum_i 2^((a_ti + l_ji) - s_t) [v_j, 1],
// the pairs' exponentials as products of factors <= 1 (raw_cpu_pairs.h). The pair attaining s_t
// contributes an exact 1, so n_t[Dv] >= 1. Products of small factors can be subnormal, which x86
// CPUs compute slowly: the kernel flushes them to 0 (FlushSubnormals), as its exp2 does below 2^-126.
#include "attention/ops/raw_cpu_kernel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "attention/ops/cpu_gemm.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_features.h"
#include "attention/ops/raw_cpu_pairs.h"
#include "attention/ops/raw_cpu_scratch.h"
#include "attention/ops/sub_chunk.h"

namespace darkformer {

namespace {

using namespace raw_cpu;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::atomic<int64_t> row_runs{0};

// max_i (a_i + b_i) in eight independent lanes (one running max is a chain the compiler may not
// reorder; max is exact in any order).
DF_KERNEL_LOOPS float MaxOfSum(const float* a, const float* b, int64_t n) {
  float lanes[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] = std::max(lanes[l], a[i + l] + b[i + l]);
  }
  float best = std::max(std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3])),
                        std::max(std::max(lanes[4], lanes[5]), std::max(lanes[6], lanes[7])));
  for (; i < n; ++i) best = std::max(best, a[i] + b[i]);
  return best;
}

// A sub-chunk of `sl` positions as the scan sees it: its keys' log-features l2 (sl x m), its
// queries' q2 (G heads of sl rows x m, head h at h q_head_stride; nullptr: no queries), and the
// state's reference entering it (has: a state exists). Fills s.rrows (R at each position) and,
// with queries, s.s2 (their shifts).
DF_KERNEL_LOOPS void Maxima(const float* l2, const float* q2, int64_t q_head_stride, int64_t sl, const float* ref,
                            bool has, Scratch& s) {
  const int64_t m = s.m;
  for (int64_t j = 0; j < sl; ++j) {
    const float* prev = j > 0 ? s.rrows.data() + (j - 1) * m : ref;
    float* r = s.rrows.data() + j * m;
    const float* l = l2 + j * m;
    if (j == 0 && !has) {
      std::copy(l, l + m, r);
    } else {
      for (int64_t i = 0; i < m; ++i) r[i] = std::max(prev[i], l[i]);
    }
  }
  for (int64_t h = 0; h < (q2 != nullptr ? s.g : 0); ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* q = q2 + h * q_head_stride + t * m;
      const float* r = s.rrows.data() + t * m;
      s.s2[h * sl + t] = MaxOfSum(q, r, m);
    }
  }
}

// Folds the sub-chunk (key factors k = K, step decays delta, values vh, sl of them; s.rrows its
// maxima) into state/ref (has: a state exists): rows whose max grew decay by 2^(R_old - R_new) <= 1,
// the keys join at R_new.
DF_KERNEL_LOOPS void Fold(const float* k, const float* delta, const float* vh, int64_t sl, float* state, float* ref,
                          bool has, Scratch& s) {
  const int64_t m = s.m, v = s.v;
  KeysAtEnd(k, delta, sl, m, s.kk.data(), s.decay.data());
  for (int64_t i = 0; has && i < m; ++i) {
    if (s.decay[i] == 1.0f) continue;  // this feature's max did not grow
    float* row = state + i * v;
    for (int64_t c = 0; c < v; ++c) row[c] *= s.decay[i];
  }
  GemmRowMajor(true, false, m, v, sl, 1.0f, s.kk.data(), m, vh, v, has ? 1.0f : 0.0f, state, v);
  const float* end = s.rrows.data() + (sl - 1) * m;
  std::copy(end, end + m, ref);
}

// The forward of one sub-chunk: queries q2 (head stride q_head_stride), keys l2 (replaced by their
// factors K), values vh, sl positions from `pos`; writes out and den, then folds the sub-chunk into
// the state.
DF_KERNEL_LOOPS void SubChunkForward(const PositiveRowForward& o, const float* q2, int64_t q_head_stride, float* l2,
                                     const float* vh, int64_t pos, int64_t sl, bool has, Scratch& s) {
  const int64_t m = s.m, v = s.v, dv = s.dv, g = s.g;
  Maxima(l2, q2, q_head_stride, sl, s.ref.data(), has, s);
  KeyFactors(l2, s.rrows.data(), s.ref.data(), has, sl, m, l2, s.delta.data());
  // Inside the sub-chunk: n_t = sum_{j <= t} w_tj [v_j, 1], w_tj = Q_t prod delta K_j (from j = t
  // down, so Q_t's running product ends as its state-read factor).
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      float* run = s.qc.data() + (h * sl + t) * m;
      Exp2OfSum(q2 + h * q_head_stride + t * m, s.rrows.data() + t * m, s.s2[h * sl + t], run, m);
      float* n = s.n.data() + (h * sl + t) * v;
      std::fill(n, n + v, 0.0f);
      for (int64_t j = t; j >= 0; --j) {
        const float w = DotThenScale(run, l2 + j * m, s.delta.data() + j * m, m);
        const float* row = vh + j * v;
        for (int64_t c = 0; c < v; ++c) n[c] += w * row[c];
      }
    }
  }
  // Earlier keys, through the state.
  if (has) GemmRowMajor(false, false, g * sl, v, m, 1.0f, s.qc.data(), m, s.state.data(), v, 1.0f, s.n.data(), v);
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* n = s.n.data() + (h * sl + t) * v;
      const float den = n[dv];  // >= 1
      float* out = o.out + h * o.out_head_stride + (pos + t) * dv;
      for (int64_t c = 0; c < dv; ++c) out[c] = n[c] / den;
      o.den[h * o.den_head_stride + pos + t] = den;
    }
  }
  Fold(l2, s.delta.data(), vh, sl, s.state.data(), s.ref.data(), has, s);
}

// dL/dn for a sub-chunk's queries: [g_t / den_t, -(g_t . out_t) / den_t], G sl x V into hn.
DF_KERNEL_LOOPS void GradN(const PositiveRow& p, const PositiveRowBackward& b, int64_t pos, int64_t sl, float* hn,
                           const Scratch& s) {
  for (int64_t h = 0; h < p.group; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* g = b.g + h * b.g_head_stride + (pos + t) * s.dv;
      const float* out = b.out + h * b.out_head_stride + (pos + t) * s.dv;
      const float inv = 1.0f / b.den[h * b.den_head_stride + pos + t];
      float* row = hn + (h * sl + t) * s.v;
      for (int64_t k = 0; k < s.dv; ++k) row[k] = g[k] * inv;
      row[s.dv] = -Dot(g, out, s.dv) * inv;
    }
  }
}

// A sub-chunk of a backward group: its slot in the group's buffers, first position, length, and
// the group's query head stride (group length x m).
struct GroupSlot {
  int64_t slot, pos, sl, q_stride;
};

// The backward's forward pass over one sub-chunk (has: a state enters it; fold: fold it into the
// state for the next): Q, K and the step decays replace the log-features, dL/dn goes to group_h,
// the state term of dL/da to group_da.
DF_KERNEL_LOOPS void BackwardForwardStep(const PositiveRow& p, const PositiveRowBackward& b, const GroupSlot& u,
                                         bool has, bool fold, Scratch& s) {
  const int64_t g = s.g, m = s.m, v = s.v, sl = u.sl, sm = s.s * m;
  float* kf = s.group_l2.data() + u.slot * sm;  // l2, then K
  float* qf = s.group_q2.data() + u.slot * sm;  // a2, then Q; head h at h q_stride
  float* delta = s.group_delta.data() + u.slot * sm;
  float* hn = s.group_h.data() + u.slot * g * s.s * v;
  Maxima(kf, qf, u.q_stride, sl, s.ref.data(), has, s);
  KeyFactors(kf, s.rrows.data(), s.ref.data(), has, sl, m, kf, delta);
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      float* q = qf + h * u.q_stride + t * m;
      Exp2OfSum(q, s.rrows.data() + t * m, s.s2[h * sl + t], q, m);
    }
  }
  GradN(p, b, u.pos, sl, hn, s);
  if (has) {
    for (int64_t h = 0; h < g; ++h) {
      StateReadFromQ(qf + h * u.q_stride, delta, sl, m, s.qc.data() + h * sl * m, s.decay.data());
    }
    GemmRowMajor(false, true, g * sl, m, v, 1.0f, hn, v, s.state.data(), v, 0.0f, s.tmp.data(), m);
  }
  for (int64_t h = 0; h < g; ++h) {
    float* da = s.group_da.data() + h * u.q_stride + u.slot * sm;
    const float* c = s.qc.data() + h * sl * m;
    const float* t = s.tmp.data() + h * sl * m;
    if (has) {
      for (int64_t i = 0; i < sl * m; ++i) da[i] = c[i] * t[i];
    } else {
      std::fill(da, da + sl * m, 0.0f);
    }
  }
  if (fold) {
    ValuesWithOnes(p, u.pos, sl, s.vh.data());
    Fold(kf, delta, s.vh.data(), sl, s.state.data(), s.ref.data(), has, s);
  }
}

// The backward's reverse pass over one sub-chunk (has_in: a state enters it; has_z: later
// sub-chunks left a reverse state Z): the pairs into dL/da, dL/dl and dL/dv, the Z terms of dL/dl
// and dL/dv, then Z moved to the sub-chunk before.
DF_KERNEL_LOOPS void BackwardReverseStep(const PositiveRow& p, const PositiveRowBackward& b, const GroupSlot& u,
                                         bool has_in, bool has_z, Scratch& s) {
  const int64_t g = s.g, m = s.m, v = s.v, sl = u.sl, sm = s.s * m;
  const float* kf = s.group_l2.data() + u.slot * sm;
  const float* qf = s.group_q2.data() + u.slot * sm;
  const float* delta = s.group_delta.data() + u.slot * sm;
  const float* hn = s.group_h.data() + u.slot * g * s.s * v;
  float* dl = s.group_dl.data() + u.slot * sm;
  ValuesWithOnes(p, u.pos, sl, s.vh.data());
  std::fill(dl, dl + sl * m, 0.0f);
  std::fill(s.dvh.begin(), s.dvh.begin() + sl * v, 0.0f);
  // The sub-chunk's own pairs, each into d a and d l at once; Q_t's running product ends as its
  // state-read factor.
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      float* run = s.qc.data() + (h * sl + t) * m;
      const float* q = qf + h * u.q_stride + t * m;
      std::copy(q, q + m, run);
      const float* ht = hn + (h * sl + t) * v;
      float* da = s.group_da.data() + h * u.q_stride + u.slot * sm + t * m;
      for (int64_t j = t; j >= 0; --j) {
        const float pw = Dot(ht, s.vh.data() + j * v, v);
        const float w = AccumulateThenScale(run, kf + j * m, delta + j * m, pw, da, dl + j * m, m);
        float* dvh = s.dvh.data() + j * v;
        for (int64_t c = 0; c < v; ++c) dvh[c] += w * ht[c];
      }
    }
  }
  // The sub-chunk's share T of the reverse state.
  if (has_in) GemmRowMajor(true, false, m, v, g * sl, 1.0f, s.qc.data(), m, hn, v, 0.0f, s.t.data(), v);
  // Keys and values against the later sub-chunks' queries (the reverse state Z at R(f)).
  if (has_z) {
    KeysAtEnd(kf, delta, sl, m, s.kk.data(), s.decay.data());  // and the decay 2^(R(e') - R(f))
    GemmRowMajor(false, true, sl, m, v, 1.0f, s.vh.data(), v, s.z.data(), v, 0.0f, s.tmp.data(), m);
    for (int64_t i = 0; i < sl * m; ++i) dl[i] += s.kk[i] * s.tmp[i];
    GemmRowMajor(false, false, sl, v, m, 1.0f, s.kk.data(), m, s.z.data(), v, 1.0f, s.dvh.data(), v);
  }
  for (int64_t j = 0; j < sl; ++j) std::copy(s.dvh.data() + j * v, s.dvh.data() + j * v + s.dv, b.dv + (u.pos + j) * s.dv);
  if (!has_in) return;  // the row's first sub-chunk
  // Z for the sub-chunk before, at its R: T + 2^(R(e') - R(f)) Z.
  if (!has_z) {
    std::copy(s.t.data(), s.t.data() + m * v, s.z.data());
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    const float decay = s.decay[i];
    float* z = s.z.data() + i * v;
    const float* t = s.t.data() + i * v;
    for (int64_t c = 0; c < v; ++c) z[c] = t[c] + decay * z[c];
  }
}

}  // namespace

int64_t CheckpointSubChunks(int64_t features, int64_t chunk) {
  const int64_t sub = causal_ops::SubChunk(chunk, causal_ops::kMaxRawSubChunk);
  return std::max<int64_t>(1, (features + sub - 1) / sub);
}

int64_t CheckpointCount(int64_t length, int64_t features, int64_t chunk) {
  const int64_t sub = causal_ops::SubChunk(chunk, causal_ops::kMaxRawSubChunk), subs = (length + sub - 1) / sub,
                per = CheckpointSubChunks(features, chunk);
  return (subs + per - 1) / per;
}

int64_t PositiveRowKernelRuns() { return row_runs.load(); }

void RunPositiveRowForward(const PositiveRow& p, const PositiveRowForward& o) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
  const FlushSubnormals flush;
  Scratch& s = ScratchFor(p);
  const int64_t m = p.features, mv = m * s.v;
  bool has = false;
  for (int64_t start = 0; start < p.length; start += p.chunk) {
    const int64_t c = std::min(p.chunk, p.length - start);
    QueryLog2(p, start, c, s.q2.data());
    KeyLog2(p, start, c, s.l2.data());
    ValuesWithOnes(p, start, c, s.vh.data());
    for (int64_t sub = 0; sub < c; sub += s.s) {
      const int64_t sl = std::min(s.s, c - sub), k = (start + sub) / s.s;
      if (k % s.group_subs == 0) {  // the checkpoint: the state before this sub-chunk
        const int64_t n = k / s.group_subs;
        float* saved = o.states + n * mv;
        float* refs = o.state_refs + n * m;
        if (has) {
          std::copy(s.state.data(), s.state.data() + mv, saved);
          std::copy(s.ref.data(), s.ref.data() + m, refs);
        } else {
          std::fill(saved, saved + mv, 0.0f);
          std::fill(refs, refs + m, kNegInf);
        }
      }
      SubChunkForward(o, s.q2.data() + sub * m, c * m, s.l2.data() + sub * m, s.vh.data() + sub * s.v, start + sub,
                      sl, has, s);
      has = true;
    }
  }
}

// The backward, one reverse scan over groups of sub-chunks. For query t and key j, with
// h_t = dL/dn_t and the same factors as the forward (d/d of the natural-log features):
//   dL/da_t = 2^((a_t + R(e')) - s_t) * (S(e') h_t)  +  sum_{j <= t in the sub-chunk} 2^((a_t + l_j) - s_t) (h_t . [v_j, 1])
//   dL/dl_j = 2^(l_j - R(f)) * (Z [v_j, 1])  +  sum_{t >= j in the sub-chunk} (the same pair terms)
//   dL/d[v_j, 1] = 2^(l_j - R(f)) Z  +  sum_{t >= j in the sub-chunk} w_tj h_t
// with f the sub-chunk's last position and Z the reverse state: the later queries' sums
// T = sum_t 2^((a_t + R(e')) - s_t) h_t^T, each brought to R(f) (Z_prev = T + 2^(R(e') - R(f)) Z).
// Every exponential is taken in the factors of raw_cpu_pairs.h, the same as the forward's.
// A group first computes its query and key log-features; a forward pass refolds the states from
// the group's checkpoint, turns the log-features into Q, K and the step decays, and adds each
// sub-chunk's state term to dL/da as it goes (so no entering state is kept); a reverse pass adds
// the pairs and the Z terms; last the features' gradients go through one set of products for the
// whole group (FeatureBackward).
void RunPositiveRowBackward(const PositiveRow& p, const PositiveRowBackward& b) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
  const FlushSubnormals flush;
  Scratch& s = ScratchFor(p);
  FitBackward(s);
  const int64_t m = p.features, mv = m * s.v;
  const int64_t subs = (p.length + s.s - 1) / s.s, groups = (subs + s.group_subs - 1) / s.group_subs;
  bool has_z = false;
  for (int64_t group = groups - 1; group >= 0; --group) {
    const int64_t first = group * s.group_subs, end = std::min(subs, first + s.group_subs);
    const int64_t gpos = first * s.s, glen = std::min(p.length, end * s.s) - gpos;
    KeyLog2(p, gpos, glen, s.group_l2.data());
    QueryLog2(p, gpos, glen, s.group_q2.data());
    std::copy(b.states + group * mv, b.states + (group + 1) * mv, s.state.data());
    std::copy(b.state_refs + group * m, b.state_refs + (group + 1) * m, s.ref.data());
    for (int64_t k = first; k < end; ++k) {
      const int64_t pos = k * s.s;
      BackwardForwardStep(p, b, {k - first, pos, std::min(s.s, p.length - pos), glen * m}, k > 0, k + 1 < end, s);
    }
    for (int64_t k = end - 1; k >= first; --k) {
      const int64_t pos = k * s.s;
      BackwardReverseStep(p, b, {k - first, pos, std::min(s.s, p.length - pos), glen * m}, k > 0, has_z, s);
      has_z = true;
    }
    // d/d(base-2 log) to d/d(natural log): the exponentials are the same numbers, so the sums
    // above are already the natural-log gradients.
    FeatureBackward(p, b, gpos, glen, s.group_da.data(), s.group_dl.data());
  }
}

}  // namespace darkformer
