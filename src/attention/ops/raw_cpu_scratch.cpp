// The raw CPU kernel's per-thread buffers (see raw_cpu_scratch.h).
#include "attention/ops/raw_cpu_scratch.h"

#include "attention/ops/sub_chunk.h"

namespace darkformer::raw_cpu {

namespace {

// Grown, never shrunk.
void Fit(std::vector<float>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
}

}  // namespace

Scratch& ScratchFor(const PositiveRow& p) {
  thread_local Scratch s;
  s.g = p.group;
  s.c = p.chunk;
  s.s = causal_ops::SubChunk(p.chunk, causal_ops::kMaxRawSubChunk);
  s.m = p.features;
  s.d = p.dim;
  s.dv = p.value_dim;
  s.v = p.value_dim + 1;
  s.group_subs = CheckpointSubChunks(p.features, p.chunk);
  const int64_t gc = s.g * s.c, gs = s.g * s.s, mv = s.m * s.v;
  Fit(s.q2, gc * s.m);
  Fit(s.l2, s.c * s.m);
  Fit(s.vh, s.c * s.v);
  Fit(s.rrows, s.s * s.m);
  Fit(s.s2, gs);
  Fit(s.qc, gs * s.m);
  Fit(s.delta, s.s * s.m);
  Fit(s.n, gs * s.v);
  Fit(s.kk, s.s * s.m);
  Fit(s.state, mv);
  Fit(s.ref, s.m);
  Fit(s.decay, s.m);
  return s;
}

void FitBackward(Scratch& s) {
  const int64_t gs = s.g * s.s, mv = s.m * s.v;
  const int64_t group_sm = s.group_subs * s.s * s.m;
  Fit(s.group_l2, group_sm);
  Fit(s.group_q2, s.g * group_sm);
  Fit(s.group_da, s.g * group_sm);
  Fit(s.group_dl, group_sm);
  Fit(s.group_delta, group_sm);
  Fit(s.group_h, s.group_subs * gs * s.v);
  Fit(s.dvh, s.s * s.v);
  Fit(s.tmp, gs * s.m);
  Fit(s.z, mv);
  Fit(s.t, mv);
}

}  // namespace darkformer::raw_cpu
