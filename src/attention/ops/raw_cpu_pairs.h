// The raw CPU kernel's sub-chunk pairs in factors (raw_cpu_kernel.h). Inside a sub-chunk, with R(j)
// the running maxima at key j and R(-1) the state's reference entering it (all base 2):
//   2^((a_ti + l_ji) - s_t) = Q_ti * prod_{j < k <= t} delta_ki * K_ji,
//   Q_t = 2^((a_t + R(t)) - s_t),  K_j = 2^(l_j - R(j)),  delta_k = 2^(R(k-1) - R(k)),
// every factor <= 1 (a_t + R(t) <= s_t by s_t's definition, R is a running max), so no partial
// product overflows, and none underflows where the pair's own exponential is a normal number: each
// partial product is >= it. The pair attaining s_t is an exact 1 (all its factors are 2^0). Running
// the product from j = t down to the sub-chunk's first key leaves Q_t's state-read factor
// 2^((a_t + R(-1)) - s_t); from the last key down, each key's factor at the sub-chunk's end and the
// state's decay 2^(R(-1) - R(end)). So a sub-chunk costs (2 + G) m exponentials per position, not
// G (S + 3) m / 2 + m: the pairs are products and sums.
#pragma once

#include <cstdint>

namespace darkformer::raw_cpu {

// K (sl x m) = 2^(l2 - R) and delta (sl x m) = 2^(R(j-1) - R(j)) from the keys' log-features l2,
// their running maxima rrows (sl x m) and the entering reference ref (m; has = false: none, and
// delta_0 = 1). K may alias l2.
void KeyFactors(const float* l2, const float* rrows, const float* ref, bool has, int64_t sl, int64_t m, float* k,
                float* delta);

// Returns sum_i p_i k_i, then p_i *= delta_i: one pair's weight, and the running product moved one
// key back.
float DotThenScale(float* p, const float* k, const float* delta, int64_t m);

// The backward's pair: e = p k; da += weight e; dk += weight e; p *= delta. Returns sum_i e_i.
float AccumulateThenScale(float* p, const float* k, const float* delta, float weight, float* da, float* dk, int64_t m);

// Each key's factor at the sub-chunk's end, keys_at_end_j = K_j prod_{j < k < sl} delta_k (sl x m),
// and the state's decay prod_{k < sl} delta_k = 2^(R(-1) - R(end)) (m).
void KeysAtEnd(const float* k, const float* delta, int64_t sl, int64_t m, float* keys_at_end, float* decay);

// out_t = q_t prod_{k <= t} delta_k for t < sl: the queries' state-read factors from Q (sl x m).
void StateReadFromQ(const float* q, const float* delta, int64_t sl, int64_t m, float* out, float* running);

}  // namespace darkformer::raw_cpu
