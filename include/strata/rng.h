// Counter-based random numbers: a value is a pure function of (seed, counters), so results do
// not depend on how work is split over ranks or threads, and no RNG state has to be carried.
#pragma once
#include <cstdint>

namespace strata {

// SplitMix64 finaliser: a strong 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }
// Uniform in [0, 1) with 24 random bits (exactly representable in float).
inline float uniform01(uint64_t bits) { return float(bits >> 40) * (1.0f / 16777216.0f); }

// A small sequential generator for initialisation and shuffles (deterministic on every
// platform, unlike std::uniform_real_distribution).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(mix64(seed)) {}
  uint64_t next() { return mix64(state++); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(next()); }
  // Uniform integer in [0, n) without modulo bias worth caring about for n < 2^32.
  uint64_t below(uint64_t n) { return uint64_t((unsigned __int128)next() * n >> 64); }
};

}  // namespace strata
