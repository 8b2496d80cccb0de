// Host-and-device copies of strata/rng.h's counter-based hash (that header is host-only C++).
// They must stay bit-for-bit the same functions: the dropout test compares the CUDA mask with
// the CPU's.
#pragma once
#include <cstdint>

namespace strata::cuda::detail {

// SplitMix64 finaliser (strata::mix64).
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// strata::hash_combine
__host__ __device__ __forceinline__ uint64_t hash_combine(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b));
}
// strata::uniform01: uniform in [0, 1) with 24 random bits (exact in float).
__host__ __device__ __forceinline__ float uniform01(uint64_t bits) {
  return float(bits >> 40) * (1.0f / 16777216.0f);
}

}  // namespace strata::cuda::detail
