// A seeded pseudorandom permutation of [0, n), evaluated one index at a time in O(1) memory, so
// shuffling billions of rows needs no table: a balanced Feistel network on the smallest even bit
// width covering n, restricted to [0, n) by cycle walking (Black & Rogaway, "Ciphers with
// Arbitrary Finite Domains", CT-RSA 2002).
#pragma once

#include <array>
#include <cstdint>

namespace darkformer {

class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);

  // The image of i (< n); a bijection of [0, n) for every key.
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  static constexpr int kRounds = 6;
  uint64_t Encrypt(uint64_t x) const;

  uint64_t n_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  std::array<uint64_t, kRounds> round_keys_{};
};

}  // namespace darkformer
