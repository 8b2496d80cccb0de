// Inverted dropout with counter-based randomness: the keep decision of element j of global
// sample g at a training step is hash(seed, step, g, j), so the mask does not depend on how the
// global batch is split across ranks, nor on any RNG state.
#include <algorithm>

#include "strata/kernels_cpu.h"
#include "strata/rng.h"

namespace strata::cpu {

// inp (B, per_sample) -> out, mask (B, per_sample); mask is 0 or 1/(1-p).
void dropout_forward(float* out, float* mask, const float* inp, int B, int64_t per_sample,
                     float p, uint64_t seed, uint64_t step, int64_t first_sample) {
  const int64_t n = int64_t(B) * per_sample;
  if (p <= 0.f || p >= 1.f) {
    // p == 0 is the identity; p >= 1 drops everything (1/(1-p) would be inf).
    const bool drop_all = p >= 1.f;
    std::fill(mask, mask + n, drop_all ? 0.f : 1.f);
    if (drop_all)
      std::fill(out, out + n, 0.f);
    else
      if (out != inp) std::copy(inp, inp + n, out);  // may run in place
    return;
  }
  const float scale = 1.f / (1.f - p);
  const uint64_t key = hash_combine(seed, step);
  for (int b = 0; b < B; ++b) {
    const uint64_t sample_key = hash_combine(key, uint64_t(first_sample + b));
    float* mk = mask + b * per_sample;
    float* y = out + b * per_sample;
    const float* x = inp + b * per_sample;
    for (int64_t j = 0; j < per_sample; ++j) {
      const bool keep = uniform01(hash_combine(sample_key, uint64_t(j))) >= p;
      mk[j] = keep ? scale : 0.f;
      y[j] = x[j] * mk[j];
    }
  }
}

// dout (n), mask (n) -> dinp (n)
void dropout_backward(float* dinp, const float* dout, const float* mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * mask[i];
}

}  // namespace strata::cpu
