// Small deterministic hashes shared by the data pipeline and the kernels' draw seeds: FNV-1a for strings, SplitMix64 as a
// mixer. Both are fixed functions, so splits and shuffles reproduce across machines and builds.
#pragma once

#include <cstdint>
#include <string_view>

namespace darkformer {

inline uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// SplitMix64's finalizer (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijection on 64-bit words with good avalanche.
inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ULL;  // 2^64 / golden ratio
inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from a 64-bit hash.
inline double UnitInterval(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace darkformer
