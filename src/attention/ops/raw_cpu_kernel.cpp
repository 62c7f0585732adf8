// The fused operator's raw fp32 CPU kernel for positive features (see raw_cpu_kernel.h). All logs
// are base 2: a_t = x_t W^T log2(e) (a query's own -|x|^2/2 - log(m)/2 shifts all its arguments,
// s_t's too, and cancels), l_j = (y_j W^T - |y_j|^2/2) log2(e) (every key's -log(m)/2 cancels),
// R_i(t) = max_{j <= t} l_ji and s_t = max_i (a_ti + R_i(t)). For t in a sub-chunk whose keys
// before it live in the state (S_i relative to R_i at the previous sub-chunk's end, e'):
//   n_t = sum_i 2^((a_ti + R_i(e')) - s_t) S_i  +  sum_{j <= t in the sub-chunk} sum_i 2^((a_ti + l_ji) - s_t) [v_j, 1].
// The pair attaining s_t contributes an exact 1 (the same rounded sum), so n_t[Dv] >= 1.
#include "attention/ops/raw_cpu_kernel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/ops/cpu_gemm.h"
#include "attention/ops/fast_exp2.h"
#include "attention/ops/raw_cpu_features.h"
#include "attention/ops/sub_chunk.h"

namespace darkformer {

namespace {

using namespace raw_cpu;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::atomic<int64_t> row_runs{0};

// One thread's buffers, kept between calls (grown, never shrunk): a row's buffers allocated afresh
// per call cost page faults worth a few percent of the kernel.
struct Scratch {
  int64_t g, c, s, m, d, dv, v, group_subs;  // G, C, S, m, D, Dv, V = Dv + 1, sub-chunks per checkpoint
  // Forward: a chunk's query and key log-features (q2, l2) and [v, 1] (vh). Both directions: a
  // sub-chunk's running maxima (rrows, S x m), query shifts (s2), state-read factors (qc), pair
  // sums (w), numerators (n), folded keys (kk), the state and its reference. Backward: each sub-chunk of a group's key features, entering state
  // and reference, and the gradients of one sub-chunk.
  std::vector<float> q2, l2, vh, rrows, s2, qc, w, n, kk, state, ref, decay;
  std::vector<float> group_l2, group_states, group_refs, h, da, dl, dvh, tmp, z, t, rowsum;
  std::vector<char> group_has;
};

Scratch& ScratchFor(const PositiveRow& p) {
  thread_local Scratch s;
  s.g = p.group;
  s.c = p.chunk;
  s.s = causal_ops::SubChunk(p.chunk);
  s.m = p.features;
  s.d = p.dim;
  s.dv = p.value_dim;
  s.v = p.value_dim + 1;
  s.group_subs = CheckpointSubChunks(p.features, p.chunk);
  auto fit = [](auto& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  };
  const int64_t gc = s.g * s.c, gs = s.g * s.s, mv = s.m * s.v;
  fit(s.q2, gc * s.m);
  fit(s.l2, s.c * s.m);
  fit(s.vh, s.c * s.v);
  fit(s.rrows, s.s * s.m);
  fit(s.s2, gs);
  fit(s.qc, gs * s.m);
  fit(s.w, gs * s.s);
  fit(s.n, gs * s.v);
  fit(s.kk, s.s * s.m);
  fit(s.state, mv);
  fit(s.ref, s.m);
  fit(s.decay, s.m);
  return s;
}

void FitBackward(Scratch& s) {
  auto fit = [](auto& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  };
  const int64_t gs = s.g * s.s, mv = s.m * s.v;
  fit(s.group_l2, s.group_subs * s.s * s.m);
  fit(s.group_states, s.group_subs * mv);
  fit(s.group_refs, s.group_subs * s.m);
  fit(s.group_has, s.group_subs);
  fit(s.h, gs * s.v);
  fit(s.da, gs * s.m);
  fit(s.dl, s.s * s.m);
  fit(s.dvh, s.s * s.v);
  fit(s.tmp, gs * s.m);
  fit(s.z, mv);
  fit(s.t, mv);
  fit(s.rowsum, s.s);
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
      float best = kNegInf;
      for (int64_t i = 0; i < m; ++i) best = std::max(best, q[i] + r[i]);
      s.s2[h * sl + t] = best;
    }
  }
}

// s.qc = 2^((a_t + R(e')) - s_t) for the G sl queries of q2 (head h at h q_head_stride).
void StateReadFactors(const float* q2, int64_t q_head_stride, int64_t sl, const float* ref, Scratch& s) {
  const int64_t m = s.m;
  for (int64_t h = 0; h < s.g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      Exp2OfSum(q2 + h * q_head_stride + t * m, ref, s.s2[h * sl + t], s.qc.data() + (h * sl + t) * m, m);
    }
  }
}

// s.kk = 2^(l_j - R_end) for the sub-chunk's sl keys, R_end its last position's maxima.
DF_KERNEL_LOOPS void KeysAtEnd(const float* l2, int64_t sl, Scratch& s) {
  const int64_t m = s.m;
  const float* end = s.rrows.data() + (sl - 1) * m;
  for (int64_t j = 0; j < sl; ++j) {
    for (int64_t i = 0; i < m; ++i) s.kk[j * m + i] = l2[j * m + i] - end[i];
  }
  Exp2InPlace(s.kk.data(), sl * m);
}

// Folds the sub-chunk (keys l2, values vh, sl of them) into state/ref (has: a state exists):
// rows whose max grew decay by 2^(R_old - R_new) <= 1, the keys join at R_new.
DF_KERNEL_LOOPS void Fold(const float* l2, const float* vh, int64_t sl, float* state, float* ref, bool has, Scratch& s) {
  const int64_t m = s.m, v = s.v;
  const float* end = s.rrows.data() + (sl - 1) * m;
  KeysAtEnd(l2, sl, s);
  if (has) {
    for (int64_t i = 0; i < m; ++i) s.decay[i] = ref[i] - end[i];
    Exp2InPlace(s.decay.data(), m);
    for (int64_t i = 0; i < m; ++i) {
      if (s.decay[i] == 1.0f) continue;  // this feature's max did not grow
      float* row = state + i * v;
      for (int64_t k = 0; k < v; ++k) row[k] *= s.decay[i];
    }
  }
  GemmRowMajor(true, false, m, v, sl, 1.0f, s.kk.data(), m, vh, v, has ? 1.0f : 0.0f, state, v);
  std::copy(end, end + m, ref);
}

// The forward of one sub-chunk: queries q2 (head stride q_head_stride), keys l2, values vh, sl
// positions from `pos`; writes out and den, then folds the sub-chunk into the state.
DF_KERNEL_LOOPS void SubChunkForward(const PositiveRow& p, const PositiveRowForward& o, const float* q2,
                                     int64_t q_head_stride, const float* l2, const float* vh, int64_t pos, int64_t sl,
                                     bool has, Scratch& s) {
  const int64_t m = s.m, v = s.v, dv = s.dv, g = s.g;
  Maxima(l2, q2, q_head_stride, sl, s.ref.data(), has, s);
  // Inside the sub-chunk: n_t = sum_{j <= t} w_tj [v_j, 1], w_tj = sum_i 2^((a_ti + l_ji) - s_t).
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* q = q2 + h * q_head_stride + t * m;
      const float shift = s.s2[h * sl + t];
      float* n = s.n.data() + (h * sl + t) * v;
      std::fill(n, n + v, 0.0f);
      for (int64_t j = 0; j <= t; ++j) {
        const float w = SumExp2OfSum(q, l2 + j * m, shift, m);
        const float* row = vh + j * v;
        for (int64_t k = 0; k < v; ++k) n[k] += w * row[k];
      }
    }
  }
  // Earlier keys, through the state.
  if (has) {
    StateReadFactors(q2, q_head_stride, sl, s.ref.data(), s);
    GemmRowMajor(false, false, g * sl, v, m, 1.0f, s.qc.data(), m, s.state.data(), v, 1.0f, s.n.data(), v);
  }
  for (int64_t h = 0; h < g; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* n = s.n.data() + (h * sl + t) * v;
      const float den = n[dv];  // >= 1
      float* out = o.out + h * o.out_head_stride + (pos + t) * dv;
      for (int64_t k = 0; k < dv; ++k) out[k] = n[k] / den;
      o.den[h * o.den_head_stride + pos + t] = den;
    }
  }
  Fold(l2, vh, sl, s.state.data(), s.ref.data(), has, s);
}

// dL/dn for a sub-chunk's queries: [g_t / den_t, -(g_t . out_t) / den_t], G sl x V into s.h.
DF_KERNEL_LOOPS void GradN(const PositiveRow& p, const PositiveRowBackward& b, int64_t pos, int64_t sl, Scratch& s) {
  for (int64_t h = 0; h < p.group; ++h) {
    for (int64_t t = 0; t < sl; ++t) {
      const float* g = b.g + h * b.g_head_stride + (pos + t) * s.dv;
      const float* out = b.out + h * b.out_head_stride + (pos + t) * s.dv;
      const float inv = 1.0f / b.den[h * b.den_head_stride + pos + t];
      float* row = s.h.data() + (h * sl + t) * s.v;
      for (int64_t k = 0; k < s.dv; ++k) row[k] = g[k] * inv;
      row[s.dv] = -Dot(g, out, s.dv) * inv;
    }
  }
}

}  // namespace

int64_t CheckpointSubChunks(int64_t features, int64_t chunk) {
  const int64_t sub = causal_ops::SubChunk(chunk);
  return std::max<int64_t>(1, (features + sub - 1) / sub);
}

int64_t CheckpointCount(int64_t length, int64_t features, int64_t chunk) {
  const int64_t sub = causal_ops::SubChunk(chunk), subs = (length + sub - 1) / sub,
                per = CheckpointSubChunks(features, chunk);
  return (subs + per - 1) / per;
}

int64_t PositiveRowKernelRuns() { return row_runs.load(); }

void RunPositiveRowForward(const PositiveRow& p, const PositiveRowForward& o) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
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
      SubChunkForward(p, o, s.q2.data() + sub * m, c * m, s.l2.data() + sub * m, s.vh.data() + sub * s.v, start + sub,
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
// A group first refolds its states from its checkpoint (keeping each sub-chunk's key features
// and entering state), then runs its sub-chunks in reverse.
void RunPositiveRowBackward(const PositiveRow& p, const PositiveRowBackward& b) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
  Scratch& s = ScratchFor(p);
  FitBackward(s);
  const int64_t g = p.group, m = p.features, v = s.v, mv = m * v, sm = s.s * m;
  const int64_t subs = (p.length + s.s - 1) / s.s, groups = (subs + s.group_subs - 1) / s.group_subs;
  bool has_z = false;
  for (int64_t group = groups - 1; group >= 0; --group) {
    const int64_t first = group * s.group_subs, end = std::min(subs, first + s.group_subs);
    bool has = group > 0;
    std::copy(b.states + group * mv, b.states + (group + 1) * mv, s.state.data());
    std::copy(b.state_refs + group * m, b.state_refs + (group + 1) * m, s.ref.data());
    for (int64_t k = first; k < end; ++k) {  // refold: each sub-chunk's keys and entering state
      const int64_t slot = k - first, pos = k * s.s, sl = std::min(s.s, p.length - pos);
      float* l2 = s.group_l2.data() + slot * sm;
      KeyLog2(p, pos, sl, l2);
      s.group_has[slot] = has;
      std::copy(s.state.data(), s.state.data() + mv, s.group_states.data() + slot * mv);
      std::copy(s.ref.data(), s.ref.data() + m, s.group_refs.data() + slot * m);
      if (k + 1 < end) {
        ValuesWithOnes(p, pos, sl, s.vh.data());
        Maxima(l2, nullptr, 0, sl, s.ref.data(), has, s);  // R only
        Fold(l2, s.vh.data(), sl, s.state.data(), s.ref.data(), has, s);
        has = true;
      }
    }
    for (int64_t k = end - 1; k >= first; --k) {
      const int64_t slot = k - first, pos = k * s.s, sl = std::min(s.s, p.length - pos);
      const float* l2 = s.group_l2.data() + slot * sm;
      const float* ref = s.group_refs.data() + slot * m;
      const float* state = s.group_states.data() + slot * mv;
      const bool has_in = s.group_has[slot];
      ValuesWithOnes(p, pos, sl, s.vh.data());
      QueryLog2(p, pos, sl, s.q2.data());
      Maxima(l2, s.q2.data(), sl * m, sl, ref, has_in, s);
      GradN(p, b, pos, sl, s);
      std::fill(s.da.begin(), s.da.begin() + g * sl * m, 0.0f);
      std::fill(s.dl.begin(), s.dl.begin() + sl * m, 0.0f);
      std::fill(s.dvh.begin(), s.dvh.begin() + sl * v, 0.0f);
      // The sub-chunk's own pairs: each pair's exponentials go into d a and d l at once.
      for (int64_t h = 0; h < g; ++h) {
        for (int64_t t = 0; t < sl; ++t) {
          const float* q = s.q2.data() + (h * sl + t) * m;
          const float shift = s.s2[h * sl + t];
          const float* ht = s.h.data() + (h * sl + t) * v;
          float* da = s.da.data() + (h * sl + t) * m;
          for (int64_t j = 0; j <= t; ++j) {
            const float pw = Dot(ht, s.vh.data() + j * v, v);
            const float w = AccumulateExp2OfSum(q, l2 + j * m, shift, pw, da, s.dl.data() + j * m, m);
            float* dvh = s.dvh.data() + j * v;
            for (int64_t k2 = 0; k2 < v; ++k2) dvh[k2] += w * ht[k2];
          }
        }
      }
      // Queries against the entering state; the sub-chunk's share T of the reverse state.
      if (has_in) {
        StateReadFactors(s.q2.data(), sl * m, sl, ref, s);
        GemmRowMajor(false, true, g * sl, m, v, 1.0f, s.h.data(), v, state, v, 0.0f, s.tmp.data(), m);
        for (int64_t i = 0; i < g * sl * m; ++i) s.da[i] += s.qc[i] * s.tmp[i];
        GemmRowMajor(true, false, m, v, g * sl, 1.0f, s.qc.data(), m, s.h.data(), v, 0.0f, s.t.data(), v);
      }
      // Keys and values against the later sub-chunks' queries (the reverse state Z at R(f)).
      if (has_z) {
        KeysAtEnd(l2, sl, s);
        GemmRowMajor(false, true, sl, m, v, 1.0f, s.vh.data(), v, s.z.data(), v, 0.0f, s.tmp.data(), m);
        for (int64_t i = 0; i < sl * m; ++i) s.dl[i] += s.kk[i] * s.tmp[i];
        GemmRowMajor(false, false, sl, v, m, 1.0f, s.kk.data(), m, s.z.data(), v, 1.0f, s.dvh.data(), v);
      }
      for (int64_t j = 0; j < sl; ++j) std::copy(s.dvh.data() + j * v, s.dvh.data() + j * v + s.dv, b.dv + (pos + j) * s.dv);
      // d/d(base-2 log) to d/d(natural log): the exponentials are the same numbers, so the sums
      // above are already the natural-log gradients.
      FeatureBackward(p, b, pos, sl, s.da.data(), s.dl.data());
      if (!has_in) break;  // the row's first sub-chunk
      // Z for the sub-chunk before, at its R: T + 2^(R(e') - R(f)) Z.
      const float* end_r = s.rrows.data() + (sl - 1) * m;
      if (!has_z) std::copy(s.t.data(), s.t.data() + mv, s.z.data());
      for (int64_t i = 0; has_z && i < m; ++i) {
        const float decay = std::exp2(ref[i] - end_r[i]);
        float* z = s.z.data() + i * v;
        const float* t = s.t.data() + i * v;
        for (int64_t k2 = 0; k2 < v; ++k2) z[k2] = t[k2] + decay * z[k2];
      }
      has_z = true;
    }
  }
}

}  // namespace darkformer
