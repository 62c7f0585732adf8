// The CUDA operator's scan over one call (cuda_scan.h): its key rows, their tensors and buffers,
// and each row's view of them for the arithmetic of cuda_scan_body.h.
#pragma once

#include <cstdint>

#include "attention/ops/cuda_scan_body.h"

namespace darkformer::cuda_scan {

// The key rows of one call. Rows are a KV head of a sequence, or a query head where key features
// are per query head. Row r's query heads are r * group ... r * group + group - 1 of the folded
// B * H heads; its values are row r / value_rows_per (H / K where keys are per query head, else 1);
// its document ids (where given) are sequence r / rows_per_sequence's. Every tensor fp32, each
// per-head block L contiguous rows, but the queries, keys, values and incoming gradient as given
// (bf16 or fp32, at their strides) and the bf16 output. Chunk n of row r is call-wide chunk
// r * Chunks() + n.
struct Launch {
  int64_t rows = 0, length = 0, features = 0, value_dim = 0, group = 1, sub = 8, group_subs = 1;
  int64_t value_rows_per = 1;
  const int64_t* ids = nullptr;  // document ids, sequences x L, on the kernels' device; nullptr: none
  int64_t rows_per_sequence = 1;  // the key rows of one sequence
  bool tensor_cores = false;  // Row::tensor_cores
  bool factor_pairs = true;   // Row::factor_pairs (false: the kernel's `pairs: exponentials`)
  // The segment of every row a launch takes: chunks [first_chunk, SegmentEnd()), Segment() of them
  // but in the row's last (segment_chunks; 0: the whole row). The per-chunk buffers hold one
  // segment per row (StateSlot, ChunkSlot): a call walks its segments in turn, the state entering
  // one and the reverse state leaving it carried between them (cuda_op.cpp), so what it holds while
  // it runs is bounded by the segment, not the row.
  int64_t first_chunk = 0, segment_chunks = 0;
  // A prefill's: the row's last chunk's own state too, merged into the last slot, which so holds
  // the state after the whole row (its segment is the row).
  bool through_row_end = false;
  // The states carried between a row's segments, rows x carry_slots x m x (Dv + 1) and x m: the
  // forward's step 2 takes the state entering the segment from slot enter_slot (-1: the row's first
  // segment, the empty state) and copies the one after it, where it makes it, to slot leave_slot
  // (-1: nowhere); one slot may be both (ForwardOut::enter_state). And z_carry, rows x m x
  // (Dv + 1): Z at the segment's end from the later one, which the backward's step 2 replaces by Z
  // at the segment's start (BackwardIo::z_carry; nullptr where a row is one segment). So a segment
  // takes what the one before it left with no copy between their launches.
  float* carry_states = nullptr;
  float* carry_refs = nullptr;
  int64_t carry_slots = 0, enter_slot = -1, leave_slot = -1;
  float* z_carry = nullptr;
  // The queries (cuda_scan_queries.h): their base-2 log-features given, rows x G x L x m; or, with
  // a null, inside from the queries as given: sequences x (rows_per_sequence x G) x L x dim at the
  // strides x_strides (elements), fp32 or bf16, their projection (dim x m, per query head of a
  // sequence where proj_per_head; the keys' too) and W (m x mapped_dim).
  const float* a = nullptr;
  const void* x = nullptr;
  bool x_bf16 = false;
  int64_t x_strides[4] = {0, 0, 0, 0};
  int64_t dim = 0, mapped_dim = 0;
  const float* proj = nullptr;
  bool proj_per_head = false;
  const float* w = nullptr;
  // The keys (cuda_scan_keys.h): their base-2 log-features given, rows x L x m; or, with a null,
  // inside from the keys as given: sequences x KV heads x L x dim at the strides y_strides, fp32 or
  // bf16 (row r's KV head: r's value row), the projection above (a row's: its first query head's),
  // and n = log2(e) |y'|^2 / 2 per row and key (rows x L).
  const float* l = nullptr;
  const void* y = nullptr;
  bool y_bf16 = false;
  int64_t y_strides[4] = {0, 0, 0, 0};
  const float* key_norms = nullptr;
  // The values as given: sequences x KV heads x L x Dv at the strides v_strides, fp32 or bf16.
  const void* v = nullptr;
  bool v_bf16 = false;
  int64_t v_strides[4] = {0, 0, 0, 0};
  float* resets = nullptr;   // rows x Segment(): whether a document starts in the chunk (ChunkSlot)
  // Forward.
  float* out = nullptr;         // rows x G x L x Dv (nullptr where out16 is given)
  uint16_t* out16 = nullptr;    // the same in bf16 instead, where the caller asks (else nullptr)
  float* den = nullptr;         // rows x G x L
  // rows x (Segment() + 1) x m x (Dv + 1), x m: the state entering each chunk of the segment and
  // its reference (StateSlot; slot 0 from carry_states), and in the last slot the one entering the
  // next segment; before the forward's step 2, the slot after chunk n's holds its own state (OwnStateOf).
  float* states = nullptr;
  float* refs = nullptr;
  // Backward (reads den, states, refs too).
  float* dot = nullptr;      // rows x G x L: g_t . out_t (the query side writes it, the key side reads)
  const void* g = nullptr;   // dL/dout, sequences x H x L x Dv at the strides g_strides, fp32 or bf16
  bool g_bf16 = false;
  int64_t g_strides[4] = {0, 0, 0, 0};
  float* dq = nullptr;       // rows x G x L x m, d/d(natural-log a); inside: x G x L x mapped_dim, d x'
  float* dl = nullptr;       // rows x L x m
  // rows x L x Dv (the caller sums value_rows_per rows); or, dv_shared, value rows (rows /
  // value_rows_per) x L x Dv, zeros to which each of a value row's key rows adds its terms
  // (AddShared: atomics on the device, whose order may change the last bits from run to run).
  float* dv = nullptr;
  bool dv_shared = false;
  // rows x Segment() x group_subs x m: each sub-chunk's entering reference, which the backward's query
  // side writes as it folds a chunk and its key side reads (it used to rerun the sub-chunks' maxima).
  float* sub_refs = nullptr;
  // rows x (Segment() + 1) x m x (Dv + 1): the reverse state at the end of chunk n of the segment
  // in the slot after n's (ZAt; slot 0: at the end of the chunk before the segment, which goes on
  // to the segment before in z_carry), after the backward's step 2; before it, the slot before chunk n's holds
  // chunk n's own share of it (ZOwnOf). The states' buffer, once the query side has read them.
  float* z = nullptr;
  // The blocks of the forward's per-chunk launches (block b takes chunks b, b + F, ... of the
  // segment's: SegmentChunk) and the backward's per row (each takes every W-th chunk of its row's
  // segment): their scratch stays bounded however long the sequence.
  int64_t forward_blocks = 1, backward_blocks = 1;
  // Forward: forward_blocks x ScratchFloats(false), one per block of the forward's per-chunk
  // launches (the scans over chunks take none); backward: rows x backward_blocks x ScratchFloats(true),
  // one buffer that the backward's reruns of the forward's steps carve as the forward's.
  // Or, with scratch_shared[backward] (a device whose blocks hold it beside the products' panels:
  // ScratchFitsInSharedMemory), none: each block carves its own from its shared memory, a round
  // trip to the SM's own memory per step instead of to global memory.
  float* scratch = nullptr;
  bool scratch_shared[2] = {false, false};

  DF_HD int64_t Chunks() const { return CheckpointCount(length, sub, group_subs); }
  DF_HD int64_t Segment() const {
    return segment_chunks > 0 && segment_chunks < Chunks() ? segment_chunks : Chunks();
  }
  DF_HD int64_t Segments() const { return Segment() > 0 ? (Chunks() + Segment() - 1) / Segment() : 0; }
  DF_HD int64_t Span() const { return Segment() < Chunks() - first_chunk ? Segment() : Chunks() - first_chunk; }
  DF_HD int64_t SegmentEnd() const { return first_chunk + Span(); }
  // The chunks a launch takes, every row's segment: the forward's per-chunk blocks' work, the c-th
  // chunk SegmentChunk(c) of row SegmentRow(c).
  DF_HD int64_t SegmentChunkCount() const { return rows * Span(); }
  DF_HD int64_t SegmentRow(int64_t c) const { return c / Span(); }
  DF_HD int64_t SegmentChunk(int64_t c) const { return first_chunk + c % Span(); }
  // Chunk n of row `row` (in the segment) in the buffers of Segment() + 1 slots per row, and of Segment().
  DF_HD int64_t StateSlot(int64_t row, int64_t n) const { return row * (Segment() + 1) + n - first_chunk; }
  DF_HD int64_t ChunkSlot(int64_t row, int64_t n) const { return row * Segment() + n - first_chunk; }
  // Whether chunk n's own state enters anything: a later chunk, or a prefill's state after the row.
  DF_HD bool OwnStateEnters(int64_t n) const { return n + 1 < Chunks() || through_row_end; }
  // The scans over chunks (EnteringStates, ReverseStates) take each row in slices of SliceFeatures()
  // features, one block each: block s of row r is r * Slices() + s, features [First, Last). A slice
  // is as many whole feature rows of a state (Dv + 1 elements each) as kScanThreads threads cover one
  // element each, at least one: each element's chain over the chunks is one thread's.
  DF_HD int64_t SliceFeatures() const {
    const int64_t per = kScanThreads / (value_dim + 1);
    return per > 0 ? per : 1;
  }
  DF_HD int64_t Slices() const { return (features + SliceFeatures() - 1) / SliceFeatures(); }
  DF_HD int64_t SliceFirst(int64_t slice) const { return slice * SliceFeatures(); }
  DF_HD int64_t SliceLast(int64_t slice) const {
    return (slice + 1) * SliceFeatures() < features ? (slice + 1) * SliceFeatures() : features;
  }
  DF_HD int64_t ScratchFloats(bool backward) const {
    return Scratch::Floats(features, value_dim, group, sub, backward);
  }
  DF_HD Scratch ScratchOf(int64_t block, bool backward) const {
    return Scratch::Carve(scratch + block * ScratchFloats(backward), features, value_dim, group, sub, backward);
  }

  // Row `row`'s queries: given, or the G heads from (row % rows_per_sequence) G on of its sequence.
  DF_HD Queries QueriesOf(int64_t row) const {
    Queries q;
    if (a != nullptr) {
      q.a = a + row * group * length * features;
      q.a_head_stride = length * features;
      return q;
    }
    const int64_t head = HeadOf(row);
    const int64_t first = (row / rows_per_sequence) * x_strides[0] + head * x_strides[1];
    q.x = ElementAt(x, x_bf16, first);
    q.x_bf16 = x_bf16;
    q.x_head = x_strides[1];
    q.x_pos = x_strides[2];
    q.x_dim = x_strides[3];
    q.dim = dim;
    q.proj_head_stride = proj_per_head ? dim * features : 0;
    q.proj = ProjectionOf(row);
    q.w = w;
    q.mapped_dim = mapped_dim;
    return q;
  }
  // Row `row`'s keys: given, or its value row's keys as given, projected by its first query head's P.
  DF_HD Keys KeysOf(int64_t row) const {
    Keys k;
    if (l != nullptr) {
      k.l = l + row * length * features;
      return k;
    }
    k.y = ElementAt(y, y_bf16, (row / rows_per_sequence) * y_strides[0] + KvHeadOf(row) * y_strides[1]);
    k.y_bf16 = y_bf16;
    k.y_pos = y_strides[2];
    k.y_dim = y_strides[3];
    k.dim = dim;
    k.proj = ProjectionOf(row);
    k.norms = key_norms + row * length;
    return k;
  }
  // The first query head (of its sequence's) of row `row`, its KV head, and its projection.
  DF_HD int64_t HeadOf(int64_t row) const { return (row % rows_per_sequence) * group; }
  DF_HD int64_t KvHeadOf(int64_t row) const { return (row % rows_per_sequence) / value_rows_per; }
  DF_HD const float* ProjectionOf(int64_t row) const {
    return proj + (proj_per_head ? HeadOf(row) * dim * features : 0);
  }
  // Row `row`'s view of the call's tensors.
  DF_HD Row RowOf(int64_t row) const {
    return {length, features, value_dim, group, sub, group_subs, QueriesOf(row), KeysOf(row),
            ElementAt(v, v_bf16, (row / rows_per_sequence) * v_strides[0] + KvHeadOf(row) * v_strides[1]), v_bf16,
            v_strides[2], v_strides[3],
            ids != nullptr ? ids + (row / rows_per_sequence) * length : nullptr, tensor_cores, factor_pairs};
  }
  DF_HD ForwardOut ForwardOf(int64_t row) const {
    const int64_t ld = length * value_dim, first = StateSlot(row, first_chunk);
    return {out != nullptr ? out + row * group * ld : nullptr,
            out16 != nullptr ? out16 + row * group * ld : nullptr,
            ld,
            den + row * group * length,
            length,
            states + first * features * (value_dim + 1),
            refs + first * features,
            resets + ChunkSlot(row, first_chunk),
            first_chunk,
            Span(),
            OwnStateEnters(SegmentEnd() - 1),
            enter_slot >= 0 ? CarryStateOf(row, enter_slot) : nullptr,
            enter_slot >= 0 ? CarryRefOf(row, enter_slot) : nullptr,
            leave_slot >= 0 ? CarryStateOf(row, leave_slot) : nullptr,
            leave_slot >= 0 ? CarryRefOf(row, leave_slot) : nullptr};
  }
  DF_HD float* CarryStateOf(int64_t row, int64_t slot) const {
    return carry_states + (row * carry_slots + slot) * features * (value_dim + 1);
  }
  DF_HD float* CarryRefOf(int64_t row, int64_t slot) const { return carry_refs + (row * carry_slots + slot) * features; }
  DF_HD BackwardIo BackwardOf(int64_t row) const {
    const int64_t ld = length * value_dim, lm = length * features, first = StateSlot(row, first_chunk);
    const int64_t lq = a != nullptr ? lm : length * mapped_dim;  // per query head of dq
    return {states + first * features * (value_dim + 1), refs + first * features, den + row * group * length,
            length, dot + row * group * length,
            ElementAt(g, g_bf16, (row / rows_per_sequence) * g_strides[0] + HeadOf(row) * g_strides[1]), g_bf16,
            g_strides[1], g_strides[2], g_strides[3],
            dq + row * group * lq, lq, dl + row * lm, dv + (dv_shared ? row / value_rows_per : row) * ld, dv_shared,
            resets + ChunkSlot(row, first_chunk), sub_refs + ChunkSlot(row, first_chunk) * group_subs * features,
            first_chunk, Span(), z_carry != nullptr ? z_carry + row * features * (value_dim + 1) : nullptr};
  }
  // Where step 1 of the forward puts chunk n's own state and reference: the slot of the state
  // entering chunk n + 1, which step 2 merges in place (EnteringStates); the segment's last chunk's,
  // the last slot, where the next segment's entering state (a prefill's state after the row) is made.
  DF_HD float* OwnStateOf(int64_t row, int64_t n) const {
    return states + (StateSlot(row, n) + 1) * features * (value_dim + 1);
  }
  DF_HD float* OwnRefOf(int64_t row, int64_t n) const { return refs + (StateSlot(row, n) + 1) * features; }
  DF_HD float* ResetOf(int64_t row, int64_t n) const { return resets + ChunkSlot(row, n); }
  // Row `row`'s reverse states, the reverse state at chunk n's end (the slot after n's), and where
  // step 1 of the backward puts chunk n >= 1's own share of the one at chunk n - 1's end (n's slot),
  // which step 2 completes in place (ReverseStates).
  DF_HD float* ZOf(int64_t row) const { return z + StateSlot(row, first_chunk) * features * (value_dim + 1); }
  DF_HD float* ZAt(int64_t row, int64_t n) const { return z + (StateSlot(row, n) + 1) * features * (value_dim + 1); }
  DF_HD float* ZOwnOf(int64_t row, int64_t n) const { return z + StateSlot(row, n) * features * (value_dim + 1); }
};

// Whether a KV head's key rows (darkformer's, per query head) add their dv into one buffer with
// atomics (Launch::dv_shared), as FlashAttention's backward adds dq: 4 bytes per value element and
// key row fewer at the peak (8 KB per position at Gemma 2B's shape), where the last bits of dv may
// change from run to run. Under deterministic algorithms (train.deterministic) each row keeps its
// own buffer, summed in order: bit-identical runs. The operator and the memory estimate's shadow
// both ask here.
inline bool DvShared(int64_t value_rows_per, bool deterministic) { return value_rows_per > 1 && !deterministic; }

}  // namespace darkformer::cuda_scan
