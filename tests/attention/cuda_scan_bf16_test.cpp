// op: cuda's bf16 conversions (ops/cuda_scan_bf16.h), which the device and the host emulation
// share: the output it rounds to bf16 must be the bits LibTorch's .to(kBFloat16) gives (its
// callers converted the fp32 output so before), and bf16 read back exactly.
#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attention/ops/cuda_scan_bf16.h"

namespace darkformer {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t TorchBits(float f) { return c10::BFloat16(f).x; }

TEST(CudaScanBf16Test, RoundsAsLibTorchDoes) {
  std::vector<uint32_t> patterns;
  // Ties (the low half exactly 0x8000) with an even and an odd kept half, one above and below
  // them, and the edges: zeros, subnormals, the largest finite (which rounds to infinity), the
  // infinities and NaNs of several payloads, both signs.
  for (const uint32_t high : {0x00000000u, 0x00010000u, 0x3f800000u, 0x3f810000u, 0x7f7f0000u, 0x7f7e0000u,
                              0x00400000u}) {
    for (const uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      patterns.push_back(high | low);
    }
  }
  for (const uint32_t special : {0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7f80ffffu,
                                 0x00000001u, 0x007fffffu}) {
    patterns.push_back(special);
  }
  // A sweep over every exponent and many mantissas, and random bit patterns.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 0x1003u) patterns.push_back(static_cast<uint32_t>(u));
  std::mt19937 random(53);
  for (int i = 0; i < (1 << 20); ++i) patterns.push_back(random());
  const size_t count = patterns.size();
  for (size_t i = 0; i < count; ++i) patterns.push_back(patterns[i] ^ 0x80000000u);  // the other sign
  int64_t mismatches = 0;
  for (const uint32_t u : patterns) {
    const float f = FromBits(u);
    const uint16_t ours = cuda_scan::FloatToBf16(f), theirs = TorchBits(f);
    if (ours != theirs && mismatches++ < 5) ADD_FAILURE() << std::hex << "fp32 bits 0x" << u << ": ours 0x" << ours << ", LibTorch's 0x" << theirs;
  }
  EXPECT_EQ(mismatches, 0) << "of " << patterns.size() << " patterns";
}

TEST(CudaScanBf16Test, ReadsBackExactly) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float ours = cuda_scan::Bf16ToFloat(static_cast<uint16_t>(bits));
    c10::BFloat16 b;
    b.x = static_cast<uint16_t>(bits);
    const float theirs = static_cast<float>(b);
    uint32_t a, c;
    std::memcpy(&a, &ours, sizeof a);
    std::memcpy(&c, &theirs, sizeof c);
    ASSERT_EQ(a, c) << std::hex << "bf16 bits 0x" << bits;
  }
}

}  // namespace
}  // namespace darkformer
