// Feistel-network index permutation with cycle walking (see index_permutation.h).
#include "data/index_permutation.h"

#include "util/hashing.h"

namespace darkformer {

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  // Two equal halves; the domain 2^(2 * half_bits) is under 4n, so cycle walking takes fewer than
  // four steps on average.
  half_bits_ = bits <= 2 ? 1 : (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = SplitMix64(key);
  for (int r = 0; r < kRounds; ++r) {
    k = SplitMix64(k + static_cast<uint64_t>(r));
    round_keys_[r] = k;
  }
}

uint64_t IndexPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (uint64_t round_key : round_keys_) {
    uint64_t mixed = left ^ (SplitMix64(right ^ round_key) & half_mask_);
    left = right;
    right = mixed;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  if (n_ <= 1) return i;
  // Encrypt is a bijection of the power-of-two domain; walking its cycle from i until it lands
  // back in [0, n) gives a bijection of [0, n).
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

}  // namespace darkformer
