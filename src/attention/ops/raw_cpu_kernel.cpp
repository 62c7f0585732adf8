// The fused operator's raw fp32 CPU kernel for positive features (see raw_cpu_kernel.h). Per
// chunk, with psi_i the queries' features shifted by their row max, k_j = 2^(l2_j - max_j) the
// keys', b_j their log-scale and r_i = max_{j <= i} b_j (all base 2):
//   n_i = sum_{j <= i} (psi_i.k_j) 2^(b_j - r_i) [v_j, 1]    out_i = n_i[:Dv] / n_i[Dv]
// The backward is one reverse scan (RunPositiveRowBackward) where the LibTorch path runs two:
// the forward's checkpoints give each group of chunks its key states, so every chunk's query
// and key features are computed once in the backward instead of twice (~13 % of the operator's
// time at L = 4k on this project's 2-core CPU).
#include "attention/ops/raw_cpu_kernel.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/ops/cpu_gemm.h"
#include "attention/ops/fast_exp2.h"

// The kernel runs only where fast_exp2's loops run vectorised (x86-64 with AVX2 and FMA, checked at
// run time by the caller), so its elementwise loops may use them too; per function, not per file:
// inline library code compiled with AVX2 in this file could be picked by the linker for others.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DF_KERNEL_LOOPS __attribute__((target("avx2,fma")))
#else
#define DF_KERNEL_LOOPS
#endif

namespace darkformer {

namespace {

constexpr double kLog2E = 1.4426950408889634;

std::atomic<int64_t> row_runs{0};

// One thread's buffers, kept between calls (grown, never shrunk): a row's ~1 MiB allocated afresh
// per call cost page faults worth a few percent of the kernel.
struct Scratch {
  int64_t g, c, m, d, dv, v, group_chunks;  // G, C, m, D, Dv, V = Dv + 1, chunks per checkpoint
  // q: a chunk's query features (G c x m); k, b2: key features (c x m) and log-scales (c) of
  // every chunk of a group; states, refs, defined: the key state before each chunk of a group.
  std::vector<float> q, max, k, b2, r, a, p_, gh, ghs, vh, vw, t, s, rs, dq, rowsum, states, refs;
  std::vector<char> defined;
};

Scratch& ScratchFor(const PositiveRow& p) {
  thread_local Scratch s;
  s.g = p.group;
  s.c = p.chunk;
  s.m = p.features;
  s.d = p.dim;
  s.dv = p.value_dim;
  s.v = p.value_dim + 1;
  s.group_chunks = CheckpointChunks(p.features, p.chunk);
  auto fit = [](auto& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  };
  const int64_t gc = s.g * s.c, n = s.group_chunks;
  fit(s.q, gc * s.m);
  fit(s.max, std::max(gc, s.c));
  fit(s.k, n * s.c * s.m);
  fit(s.b2, n * s.c);
  fit(s.r, s.c);
  fit(s.a, gc * s.c);
  fit(s.p_, gc * s.c);
  fit(s.gh, gc * s.v);
  fit(s.ghs, gc * s.v);
  fit(s.vh, s.c * s.v);
  fit(s.vw, s.c * s.v);
  fit(s.t, s.c * s.v);
  fit(s.s, s.m * s.v);
  fit(s.rs, s.m * s.v);
  fit(s.dq, gc * s.m);
  fit(s.rowsum, gc);
  fit(s.states, n * s.m * s.v);
  fit(s.refs, n);
  fit(s.defined, n);
  return s;
}

// sum_k a[k] b[k] in eight independent partial sums (a vector register's lanes; one running sum
// is a chain of dependent adds the compiler may not reorder).
DF_KERNEL_LOOPS inline float Dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

// A chunk's query features psi = 2^(x W^T log2(e) - row max) into s.q (G c x m): the offset
// -|x|^2/2 - log(m)/2 of log phi cancels in the shift.
DF_KERNEL_LOOPS void QueryFeatures(const PositiveRow& p, int64_t start, int64_t c, Scratch& s) {
  const int64_t d = p.dim, m = p.features;
  for (int64_t h = 0; h < p.group; ++h) {
    GemmRowMajor(false, false, c, m, d, 1.0f, p.x + h * p.x_head_stride + start * d, d, p.w2_DM, m, 0.0f,
                 s.q.data() + h * c * m, m);
  }
  ShiftExp2Rows(s.q.data(), p.group * c, m, s.max.data());
}

// A chunk's key features k_j = 2^(y_j W^T log2(e) - max_j) into k (c x m) and their log-scales
// b2_j = (max_m log phi(y_j)) / ln 2 into b2: the key's offset enters b2 only.
DF_KERNEL_LOOPS void KeyFeatures(const PositiveRow& p, int64_t start, int64_t c, float* k, float* b2, Scratch& s) {
  const int64_t d = p.dim, m = p.features;
  GemmRowMajor(false, false, c, m, d, 1.0f, p.y + start * d, d, p.w2_DM, m, 0.0f, k, m);
  ShiftExp2Rows(k, c, m, s.max.data());
  const double half_log_m = 0.5 * std::log(static_cast<double>(m));
  for (int64_t j = 0; j < c; ++j) {
    const float* y = p.y + (start + j) * d;
    b2[j] = s.max[j] - static_cast<float>((0.5 * Dot(y, y, d) + half_log_m) * kLog2E);
  }
}

// [v_j, 1] for the chunk's values: c x V.
DF_KERNEL_LOOPS void ValuesWithOnes(const PositiveRow& p, int64_t start, int64_t c, Scratch& s) {
  for (int64_t j = 0; j < c; ++j) {
    const float* v = p.v + (start + j) * s.dv;
    float* out = s.vh.data() + j * s.v;
    std::copy(v, v + s.dv, out);
    out[s.dv] = 1.0f;
  }
}

// out[i] = rows[i] 2^(ref - r[i % c]) for G c rows of `width` floats (query i of every head);
// out may be rows.
DF_KERNEL_LOOPS void ScaleQueryRows(const float* rows, float* out, int64_t g, int64_t c, int64_t width, float ref,
                                    const float* r) {
  for (int64_t i = 0; i < c; ++i) {
    const float w = std::exp2(ref - r[i]);
    for (int64_t h = 0; h < g; ++h) {
      const float* row = rows + (h * c + i) * width;
      float* o = out + (h * c + i) * width;
      for (int64_t k = 0; k < width; ++k) o[k] = row[k] * w;
    }
  }
}

// The running key state S = sum_j 2^(b_j - ref) k_j [v_j, 1]^T (m x V), folded with a chunk
// whose last prefix max is new_ref (>= ref: every factor <= 1); the weights go on [v, 1].
struct KeyState {
  bool defined = false;
  float ref = 0.0f;
  DF_KERNEL_LOOPS void Fold(const float* k, int64_t c, const float* b2, float new_ref, Scratch& s) {
    for (int64_t j = 0; j < c; ++j) {
      const float w = std::exp2(b2[j] - new_ref);
      for (int64_t k2 = 0; k2 < s.v; ++k2) s.vw[j * s.v + k2] = s.vh[j * s.v + k2] * w;
    }
    const float beta = defined ? std::exp2(ref - new_ref) : 0.0f;
    GemmRowMajor(true, false, s.m, s.v, c, 1.0f, k, s.m, s.vw.data(), s.v, beta, s.s.data(), s.v);
    defined = true;
    ref = new_ref;
  }
};

void CausalWeights(std::initializer_list<float*> blocks, int64_t g, int64_t c, const float* b2, const float* r) {
  std::vector<float*> pointers(blocks);
  MulCausalWeights(pointers.data(), static_cast<int>(pointers.size()), 1, g, c, b2, c, r, c);
}

// Closed-form backward of c rows of positive features: dl = dphi * phi (in place in dphi; the
// shifts are constants), dx = dl W - x sum_m dl, dW += dl^T x.
DF_KERNEL_LOOPS void FeatureBackward(const PositiveRow& p, float* dphi, const float* phi, const float* x, float* dx, int64_t c,
                     float* dw_MD, Scratch& s) {
  const int64_t m = p.features, d = p.dim;
  for (int64_t i = 0; i < c; ++i) {
    float* dl = dphi + i * m;
    const float* f = phi + i * m;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= m; k += 8) {
      for (int l = 0; l < 8; ++l) lanes[l] += (dl[k + l] *= f[k + l]);
    }
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; k < m; ++k) sum += (dl[k] *= f[k]);
    s.rowsum[i] = sum;
  }
  GemmRowMajor(false, false, c, d, m, 1.0f, dphi, m, p.w_MD, d, 0.0f, dx, d);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t k = 0; k < d; ++k) dx[i * d + k] -= x[i * d + k] * s.rowsum[i];
  }
  if (dw_MD != nullptr) GemmRowMajor(true, false, m, d, c, 1.0f, dphi, m, x, d, 1.0f, dw_MD, d);
}

// dL/dn for the chunk's queries: [g_i / den_i, -(g_i.out_i) / den_i], G c x V into s.gh.
DF_KERNEL_LOOPS void GradN(const PositiveRow& p, const PositiveRowBackward& b, int64_t start, int64_t c, Scratch& s) {
  for (int64_t h = 0; h < p.group; ++h) {
    for (int64_t i = 0; i < c; ++i) {
      const float* g = b.g + h * b.g_head_stride + (start + i) * s.dv;
      const float* out = b.out + h * b.out_head_stride + (start + i) * s.dv;
      const float inv = 1.0f / b.den[h * b.den_head_stride + start + i];
      float* row = s.gh.data() + (h * c + i) * s.v;
      for (int64_t k = 0; k < s.dv; ++k) row[k] = g[k] * inv;
      row[s.dv] = -Dot(g, out, s.dv) * inv;
    }
  }
}

}  // namespace

int64_t CheckpointChunks(int64_t features, int64_t chunk) { return std::max<int64_t>(1, (features + chunk - 1) / chunk); }

int64_t CheckpointCount(int64_t length, int64_t features, int64_t chunk) {
  const int64_t chunks = (length + chunk - 1) / chunk, per = CheckpointChunks(features, chunk);
  return (chunks + per - 1) / per;
}

int64_t PositiveRowKernelRuns() { return row_runs.load(); }

void RunPositiveRowForward(const PositiveRow& p, const PositiveRowForward& o) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
  Scratch& s = ScratchFor(p);
  const int64_t g = p.group, m = p.features, v = s.v;
  float* k = s.k.data();
  float* b2 = s.b2.data();
  KeyState state;
  for (int64_t start = 0, chunk = 0; start < p.length; start += p.chunk, ++chunk) {
    const int64_t c = std::min(p.chunk, p.length - start), gc = g * c;
    if (chunk % s.group_chunks == 0) {  // the checkpoint: the state before this chunk
      const int64_t n = chunk / s.group_chunks;
      float* saved = o.states + n * m * v;
      if (state.defined) {
        std::copy(s.s.data(), s.s.data() + m * v, saved);
      } else {
        std::fill(saved, saved + m * v, 0.0f);
      }
      o.state_refs[n] = state.defined ? state.ref : 0.0f;
    }
    QueryFeatures(p, start, c, s);
    KeyFeatures(p, start, c, k, b2, s);
    float* psi = s.q.data();
    float running = state.defined ? state.ref : -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < c; ++j) {
      running = std::max(running, b2[j]);
      s.r[j] = o.r[start + j] = running;
    }
    ValuesWithOnes(p, start, c, s);
    // Within the chunk: (psi k^T, weighted, later keys 0) [v, 1]; then the state's share.
    GemmRowMajor(false, true, gc, c, m, 1.0f, psi, m, k, m, 0.0f, s.a.data(), c);
    CausalWeights({s.a.data()}, g, c, b2, s.r.data());
    float* n = s.gh.data();
    GemmRowMajor(false, false, gc, v, c, 1.0f, s.a.data(), c, s.vh.data(), v, 0.0f, n, v);
    if (state.defined) {
      ScaleQueryRows(psi, psi, g, c, m, state.ref, s.r.data());  // psi is not read again
      GemmRowMajor(false, false, gc, v, m, 1.0f, psi, m, s.s.data(), v, 1.0f, n, v);
    }
    for (int64_t h = 0; h < g; ++h) {
      for (int64_t i = 0; i < c; ++i) {
        const float* row = n + (h * c + i) * v;
        // Rows below the guard take the per-feature form's values (normaliser_check.h); the
        // smallest normal only keeps their discarded values and zero gradients finite.
        const float den = std::max(row[s.dv], FLT_MIN);
        float* out = o.out + h * o.out_head_stride + (start + i) * s.dv;
        for (int64_t k2 = 0; k2 < s.dv; ++k2) out[k2] = row[k2] / den;
        o.den[h * o.den_head_stride + start + i] = den;
      }
    }
    if (start + c < p.length) state.Fold(k, c, b2, s.r[c - 1], s);
  }
}

// The backward, one reverse scan. For query i and key j of chunks in the past of i (state S) or
// in the same chunk, with gh_i = dL/dn_i:
//   dL/dpsi_i = sum_{j <= i} 2^(b_j - r_i) (gh_i.[v_j, 1]) k_j           (S before i's chunk)
//   dL/dk_j   = sum_{i >= j} 2^(b_j - r_i) (gh_i.[v_j, 1]) psi_i         (R after j's chunk)
//   dL/d[v_j, 1] = sum_{i >= j} (psi_i.k_j) 2^(b_j - r_i) gh_i
// with the running query state R = sum_i 2^(ref - r_i) psi_i gh_i^T (m x V, ref = the chunk's last
// r). Groups of chunks go in reverse; a group first refolds its states S from its checkpoint
// (keeping its key features), then runs its chunks in reverse.
void RunPositiveRowBackward(const PositiveRow& p, const PositiveRowBackward& b) {
  row_runs.fetch_add(1, std::memory_order_relaxed);
  Scratch& s = ScratchFor(p);
  const int64_t g = p.group, m = p.features, d = p.dim, v = s.v, mv = m * v, cm = s.c * m;
  const int64_t chunks = (p.length + p.chunk - 1) / p.chunk;
  const int64_t groups = (chunks + s.group_chunks - 1) / s.group_chunks;
  bool has_r = false;
  for (int64_t group = groups - 1; group >= 0; --group) {
    const int64_t first = group * s.group_chunks, end = std::min(chunks, first + s.group_chunks);
    KeyState state;
    state.defined = group > 0;
    state.ref = b.state_refs[group];
    if (state.defined) std::copy(b.states + group * mv, b.states + (group + 1) * mv, s.s.data());
    for (int64_t chunk = first; chunk < end; ++chunk) {
      const int64_t slot = chunk - first, start = chunk * p.chunk, c = std::min(p.chunk, p.length - start);
      KeyFeatures(p, start, c, s.k.data() + slot * cm, s.b2.data() + slot * s.c, s);
      s.defined[slot] = state.defined;
      s.refs[slot] = state.ref;
      if (state.defined) std::copy(s.s.data(), s.s.data() + mv, s.states.data() + slot * mv);
      if (chunk + 1 < end) {
        ValuesWithOnes(p, start, c, s);
        state.Fold(s.k.data() + slot * cm, c, s.b2.data() + slot * s.c, b.r[start + c - 1], s);
      }
    }
    for (int64_t chunk = end - 1; chunk >= first; --chunk) {
      const int64_t slot = chunk - first, start = chunk * p.chunk, c = std::min(p.chunk, p.length - start);
      const int64_t gc = g * c;
      const float* k = s.k.data() + slot * cm;
      const float* b2 = s.b2.data() + slot * s.c;
      const float* r = b.r + start;
      QueryFeatures(p, start, c, s);
      const float* psi = s.q.data();
      ValuesWithOnes(p, start, c, s);
      GradN(p, b, start, c, s);
      GemmRowMajor(false, true, gc, c, m, 1.0f, psi, m, k, m, 0.0f, s.a.data(), c);
      GemmRowMajor(false, true, gc, c, v, 1.0f, s.gh.data(), v, s.vh.data(), v, 0.0f, s.p_.data(), c);
      CausalWeights({s.a.data(), s.p_.data()}, g, c, b2, r);
      // Queries: the chunk's keys, then the state before it (weights 2^(ref - r_i) on gh).
      GemmRowMajor(false, false, gc, m, c, 1.0f, s.p_.data(), c, k, m, 0.0f, s.dq.data(), m);
      if (s.defined[slot]) {
        ScaleQueryRows(s.gh.data(), s.ghs.data(), g, c, v, s.refs[slot], r);
        GemmRowMajor(false, true, gc, m, v, 1.0f, s.ghs.data(), v, s.states.data() + slot * mv, v, 1.0f, s.dq.data(),
                     m);
      }
      for (int64_t h = 0; h < g; ++h) {
        FeatureBackward(p, s.dq.data() + h * c * m, psi + h * c * m, p.x + h * p.x_head_stride + start * d,
                        b.dx + h * b.dx_head_stride + start * d, c, b.dw_MD, s);
      }
      // Keys and values: sums over the row's G query heads are contractions over G c rows.
      float* dk = s.dq.data();
      GemmRowMajor(true, false, c, m, gc, 1.0f, s.p_.data(), c, psi, m, 0.0f, dk, m);
      // dv only: the gradient of [v, 1]'s constant column is never needed (Dv columns, row stride V).
      float* dvh = s.vw.data();
      GemmRowMajor(true, false, c, s.dv, gc, 1.0f, s.a.data(), c, s.gh.data(), v, 0.0f, dvh, v);
      const float ref = r[c - 1];
      if (has_r) {
        // Key weights 2^(b_j - ref) on [v_j, 1] for dk, and on (k_j R) for dv.
        GemmRowMajor(false, false, c, s.dv, m, 1.0f, k, m, s.rs.data(), v, 0.0f, s.t.data(), v);
        for (int64_t j = 0; j < c; ++j) {
          const float w = std::exp2(b2[j] - ref);
          for (int64_t k2 = 0; k2 < s.dv; ++k2) {
            dvh[j * v + k2] += w * s.t[j * v + k2];
            s.t[j * v + k2] = s.vh[j * v + k2] * w;
          }
          s.t[j * v + s.dv] = w;  // [v_j, 1]'s last entry, weighted
        }
        GemmRowMajor(false, true, c, m, v, 1.0f, s.t.data(), v, s.rs.data(), v, 1.0f, dk, m);
      }
      for (int64_t j = 0; j < c; ++j) {
        std::copy(dvh + j * v, dvh + j * v + s.dv, b.dv + (start + j) * s.dv);
      }
      FeatureBackward(p, dk, k, p.y + start * d, b.dy + start * d, c, b.dw_MD, s);
      if (start == 0) break;
      // R to the previous chunk's last r (<= every r_i from here on: factors <= 1); the query
      // weights go on gh.
      const float prev_ref = b.r[start - 1];
      ScaleQueryRows(s.gh.data(), s.gh.data(), g, c, v, prev_ref, r);
      GemmRowMajor(true, false, m, v, gc, 1.0f, psi, m, s.gh.data(), v, has_r ? std::exp2(prev_ref - ref) : 0.0f,
                   s.rs.data(), v);
      has_r = true;
    }
  }
}

}  // namespace darkformer
