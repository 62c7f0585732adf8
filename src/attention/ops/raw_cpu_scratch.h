// The raw CPU kernel's per-thread working memory (raw_cpu_kernel.cpp): the buffers a row's scan
// uses, kept between calls, and the floating-point mode it runs in.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "attention/ops/raw_cpu_kernel.h"

namespace darkformer::raw_cpu {

// Flush-to-zero and denormals-are-zero on this thread while a row runs (results below 2^-126 next
// to a normaliser >= 1 are nothing; a subnormal product costs ~100 cycles on many x86 CPUs).
class FlushSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

// One thread's buffers, kept between calls (grown, never shrunk): a row's buffers allocated afresh
// per call cost page faults worth a few percent of the kernel.
struct Scratch {
  int64_t g, c, s, m, d, dv, v, group_subs;  // G, C, S, m, D, Dv, V = Dv + 1, sub-chunks per checkpoint
  // Forward: a chunk's query and key log-features (q2, l2; K replaces l2 sub-chunk by sub-chunk)
  // and [v, 1] (vh). Both directions: a sub-chunk's running maxima (rrows, S x m), query shifts
  // (s2), step decays (delta), Q's running products that end as the state-read factors (qc),
  // numerators (n), keys at the end (kk), the state's decay, the state and its reference.
  // Backward, for a group of sub-chunks: the query and key log-features (Q and K replace them in
  // the forward pass), the step decays, dL/dn (h) and the features' gradients (their products run
  // once per group).
  std::vector<float> q2, l2, vh, rrows, s2, delta, qc, n, kk, state, ref, decay;
  std::vector<float> group_l2, group_q2, group_delta, group_da, group_dl, group_h, dvh, tmp, z, t;
};

// This thread's buffers sized for row `p`'s forward (and its sizes recorded in them).
Scratch& ScratchFor(const PositiveRow& p);
// Adds what the backward needs to buffers already sized by ScratchFor.
void FitBackward(Scratch& s);

}  // namespace darkformer::raw_cpu
