// bf16 in the CUDA operator's scan (cuda_scan_body.h): its bits read as fp32 (the queries and the
// incoming gradient as given) and fp32 rounded to them (the output in the caller's dtype), on the
// device and in the host emulation alike. The rounding is LibTorch's (c10::BFloat16: to nearest,
// ties to even; every NaN becomes 0x7FC0), so the output is the bits that .to(kBFloat16) of the
// fp32 output gives.
#pragma once

#include <cstdint>
#include <cstring>

#include "attention/ops/cuda_scan_block.h"

namespace darkformer::cuda_scan {

// The same 32 bits as another type (memcpy: defined behaviour on both executors).
template <typename To, typename From>
DF_HD inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  memcpy(&to, &from, sizeof to);
  return to;
}

// Exact: bf16 is fp32's upper half.
DF_HD inline float Bf16ToFloat(uint16_t bits) { return BitCast<float>(static_cast<uint32_t>(bits) << 16); }

DF_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Where an fp32 or bf16 tensor's element `at` lies.
DF_HD inline const void* ElementAt(const void* p, bool bf16, int64_t at) {
  return bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(p) + at)
              : static_cast<const void*>(static_cast<const float*>(p) + at);
}

// An fp32 or bf16 tensor's element `at`, as fp32.
DF_HD inline float LoadAsFloat(const void* p, bool bf16, int64_t at) {
  return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(p)[at]) : static_cast<const float*>(p)[at];
}

}  // namespace darkformer::cuda_scan
