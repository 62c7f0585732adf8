// The CUDA operator's scans over chunks (see cuda_scan_body.h: the same two executors): the
// forward's merges of the chunks' own states into the states entering them, and the backward's
// reverse states. Each element of a state merges alone, so each is one thread's chain over the
// chunks in registers, no barrier inside it.
#pragma once

#include "attention/ops/cuda_scan_body.h"

namespace darkformer::cuda_scan {

// 2. A row's checkpoints, the states entering its segment's chunks, in place: slot 0 gets the
// state entering the segment (o.enter_state: what the segment before left, or S_0 = 0 at reference
// -inf for the row's first), and the slot after chunk n's holds chunk n's own state S'_n (step 1
// wrote it there), which becomes S_{n+1} = 2^(R_n - R) S_n + 2^(R'_n - R) S'_n with R =
// max(R_n, R'_n) per feature. The last slot, past the segment's last chunk, becomes the state after
// it where o.passes (the next segment's entering state; a prefill's state after the whole row),
// then copied to o.leave_state and o.leave_ref where given (the key side reads the reference in
// the slot).
// Both factors <= 1 and the larger side's is exactly 1, so the key that attains a feature's max
// keeps its exact 1 in the normaliser. Where a document starts in chunk n (o.resets, step 1),
// S_{n+1} = S'_n at R'_n. A chain split into segments makes the same merges in the same order:
// the same bits.
// Each element merges alone, so a block takes features [f0, f1) of the row (Launch::Slices) and a
// thread an element's whole chain over the chunks: its running state and reference in registers,
// no barrier and no load that waits on the chain, the own states and references of kScanDepth
// chunks loaded at once (BatchedChain). Every thread of a feature computes its references alike from
// the own ones in the slots after, which one thread per feature overwrites with R only after a barrier.
DF_HD inline void EnteringStates(const Block& b, const Row& r, int64_t f0, int64_t f1, const ForwardOut& o) {
  const int64_t m = r.features, v = r.value_dim + 1, mv = m * v;
  // Merges n = 0 .. merges - 1, chunk first + n's own state into slot n + 1: the last slot too where o.passes.
  const int64_t merges = o.span - 1 + (o.passes ? 1 : 0);
  auto state_at = [&](int64_t n) { return o.states + (n + 1) * mv; };
  auto ref_at = [&](int64_t n) { return o.refs + (n + 1) * m; };
  // R after a merge from the running one and the chunk's own (step 1's, still in its slot).
  auto top_of = [](bool reset, float in_ref, float own_ref) { return reset ? own_ref : Max(in_ref, own_ref); };
  struct Merge {  // chunk n's own element, its own reference, and whether a document starts in it
    float own, own_ref;
    bool reset;
  };
  struct RefMerge {  // the same for the reference's chain alone
    float own_ref;
    bool reset;
  };
  // The state entering the segment into slot 0 first (apart from the chains: their registers are few).
  const bool entered = o.enter_state != nullptr;
  DF_NO_UNROLL
  for (int64_t e = b.tid; e < (f1 - f0) * v; e += b.size) o.states[f0 * v + e] = entered ? o.enter_state[f0 * v + e] : 0.0f;
  DF_NO_UNROLL
  for (int64_t i = f0 + b.tid; i < f1; i += b.size) o.refs[i] = entered ? o.enter_ref[i] : kNegInf;
  b.Sync();
  for (int64_t e = b.tid; e < (f1 - f0) * v; e += b.size) {
    const int64_t idx = f0 * v + e, i = idx / v;
    float in = o.states[idx], in_ref = o.refs[i];  // entering the segment
    BatchedChain(
        merges,
        [&](int64_t n0, int k) { return Merge{state_at(n0 + k)[idx], ref_at(n0 + k)[i], o.resets[n0 + k] != 0.0f}; },
        [&](int64_t n0, int k, const Merge& x) {
          const float top = top_of(x.reset, in_ref, x.own_ref);
          const float decay = DF_EXP2(in_ref - top), own_factor = DF_EXP2(x.own_ref - top);  // 0 for the empty S_0
          in = x.reset ? x.own : decay * in + own_factor * x.own;
          in_ref = top;
          state_at(n0 + k)[idx] = in;
        },
        [] {});
  }
  b.Sync();  // every thread has read the own references
  for (int64_t i = f0 + b.tid; i < f1; i += b.size) {  // the same chain of R, its loads batched alike
    float in_ref = o.refs[i];
    BatchedChain(
        merges, [&](int64_t n0, int k) { return RefMerge{ref_at(n0 + k)[i], o.resets[n0 + k] != 0.0f}; },
        [&](int64_t n0, int k, const RefMerge& x) {
          in_ref = top_of(x.reset, in_ref, x.own_ref);
          ref_at(n0 + k)[i] = in_ref;
        },
        [] {});
  }
  b.Sync();
  // The state after the segment, copied once made.
  if (o.passes && o.leave_state != nullptr) {
    DF_NO_UNROLL
    for (int64_t e = b.tid; e < (f1 - f0) * v; e += b.size) o.leave_state[f0 * v + e] = state_at(merges - 1)[f0 * v + e];
    DF_NO_UNROLL
    for (int64_t i = f0 + b.tid; i < f1; i += b.size) o.leave_ref[i] = ref_at(merges - 1)[i];
  }
}

// Step 2 of the backward, per row, in place: the reverse state at the end of each chunk of the
// segment from the later chunks, Z(n - 1) = Z_own(n) + 2^(R(e_n) - R(e_{n+1})) Z(n) per feature
// (the sub-chunks' decays of chunk n telescope; the factor is <= 1), or Z_own(n) alone where a
// document starts in chunk n (io.resets, from the forward's first step); Z(N - 2) = Z_own(N - 1)
// at the row's end, and before it Z at the segment's end is what the later segment passed
// (io.z_carry), put in the segment's last slot for the key side. Chunk n's slot of z
// (Launch::ZOwnOf) holds Z_own(n), chunk n's own share (step 1), and becomes Z(n - 1); the
// segment's first slot's, Z at its start, is passed on in io.z_carry to the segment before.
// The references are the checkpoints', the last slot's the next segment's entering one. The chain
// split into segments makes the same steps in the same order: the same bits. Each element is
// completed alone, so a block takes features [f0, f1) of the row (Launch::Slices) and a thread an
// element's whole chain, as EnteringStates: Z(n) in a register (read from io.z_carry first, written
// back last), the own shares and decays of kScanDepth chunks loaded at once, no barrier.
DF_HD inline void ReverseStates(const Block& b, const Row& r, int64_t f0, int64_t f1, const BackwardIo& io, float* z) {
  const int64_t m = r.features, v = r.value_dim + 1, mv = m * v, chunks = CheckpointCount(r.length, r.sub, r.group_subs);
  const int64_t end = io.first + io.span;
  const bool row_end = end >= chunks, passes_back = io.first > 0;
  // Steps n = hi, hi - 1, ..., lo, step s completing chunk hi - s's slot (chunk 0's share reaches nothing).
  const int64_t hi = row_end ? end - 2 : end - 1, lo = io.first > 1 ? io.first : 1;
  const int64_t steps = hi - lo + 1;
  struct Share {  // chunk n's own share Z_own(n), its decay 2^(R(e_n) - R(e_{n+1})), a start in it
    float own, decay;
    bool reset;
  };
  const bool work = steps > 0 || !row_end || passes_back;  // else a row of one chunk: nothing to carry
  for (int64_t e = b.tid; work && e < (f1 - f0) * v; e += b.size) {
    const int64_t idx = f0 * v + e, i = idx / v;
    float* slot = z + (hi + 1 - io.first) * mv + idx;  // step s0 + k reads and writes slot - (k + 1) mv
    const float* ref = io.refs + (hi - io.first) * m + i;
    // Z(hi): Z(N - 2) = Z_own(N - 1) at the row's end, else passed from the later segment.
    float carry = row_end ? *slot : io.z_carry[idx];
    if (!row_end) *slot = carry;
    if (steps > 0) {
      BatchedChain(
          steps,
          [&](int64_t s0, int k) {
            return Share{slot[-(k + 1) * mv], DF_EXP2(ref[-k * m] - ref[(1 - k) * m]),
                         io.resets[hi - (s0 + k) - io.first] != 0.0f};
          },
          [&](int64_t, int k, const Share& x) {
            carry = x.reset ? x.own : x.own + x.decay * carry;  // a start: Z_own(n) alone
            slot[-(k + 1) * mv] = carry;
          },
          [&] {  // the next batch's (never before the buffers' start)
            slot -= kScanDepth * mv;
            ref -= kScanDepth * m;
          });
    }
    if (passes_back) io.z_carry[idx] = carry;  // Z at the segment's start, Z(first - 1)
  }
  b.Sync();
}

}  // namespace darkformer::cuda_scan
