// Inverted dropout with the CPU kernel's counter-based mask: the keep decision of element j of
// global sample g at a step is uniform01(hash(hash(hash(seed, step), g), j)) >= p, so the mask
// is bit for bit the CPU's (rng.cuh holds device copies of strata/rng.h's hash).
#include "common.cuh"
#include "rng.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// out and inp may be the same buffer (each element is read before it is written).
template <typename I>
__global__ void dropout_forward_kernel(float* out, float* mask, const float* inp, I n,
                                       I per_sample, float p, float scale, uint64_t key,
                                       int64_t first_sample) {
  STRATA_GRID_STRIDE_T(I, i, n) {
    const I b = i / per_sample, j = i - b * per_sample;
    const uint64_t sample_key = hash_combine(key, uint64_t(first_sample + b));
    const bool keep = uniform01(hash_combine(sample_key, uint64_t(j))) >= p;
    const float m = keep ? scale : 0.f;
    mask[i] = m;
    out[i] = inp[i] * m;
  }
}

__global__ void fill_kernel(float* x, float v, int64_t n) {
  STRATA_GRID_STRIDE(i, n) x[i] = v;
}

__global__ void dropout_backward_kernel(float* dinp, const float* dout, const float* mask,
                                        int64_t n) {
  STRATA_GRID_STRIDE(i, n) dinp[i] = dout[i] * mask[i];
}

}  // namespace

// inp (B, per_sample) -> out, mask (B, per_sample); mask is 0 or 1/(1-p)
void dropout_forward(float* out, float* mask, const float* inp, int B, int64_t per_sample,
                     float p, uint64_t seed, uint64_t step, int64_t first_sample) {
  const int64_t n = int64_t(B) * per_sample;
  if (n <= 0) return;
  cudaStream_t s = ctx().stream;
  if (p <= 0.f || p >= 1.f) {
    // p == 0 is the identity; p >= 1 drops everything (1/(1-p) would be inf).
    const bool drop_all = p >= 1.f;
    fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(mask, drop_all ? 0.f : 1.f, n);
    STRATA_CUDA_LAUNCHED();
    if (drop_all)
      zero(out, sizeof(float) * n);
    else
      copy(out, inp, sizeof(float) * n);  // nothing when in place
    return;
  }
  const float scale = 1.f / (1.f - p);
  const uint64_t key = hash_combine(seed, step);
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    dropout_forward_kernel<I><<<blocks_for(n), kThreads, 0, s>>>(out, mask, inp, I(n),
                                                                 I(per_sample), p, scale, key,
                                                                 first_sample);
  });
  STRATA_CUDA_LAUNCHED();
}

// dout (n), mask (n) -> dinp (n)
void dropout_backward(float* dinp, const float* dout, const float* mask, int64_t n) {
  if (n <= 0) return;
  dropout_backward_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(dinp, dout, mask, n);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
