// Max pooling without padding, strata's own kernels (bitwise the CPU's results: a max is
// exact, and backward adds in the CPU's order).
#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// One thread per output element. The window is scanned in row-major order with the CPU's
// take_max rule: a later element wins if strictly greater or NaN, so ties keep the first and
// the last NaN wins (kernels/cpu/pool.cpp; its 2x2 path gives the same result).
template <typename I>
__global__ void maxpool_forward_kernel(float* out, int32_t* argmax, const float* inp, I n,
                                       int H, int W, int OH, int OW, int k, int st) {
  const int n_out = OH * OW;
  STRATA_GRID_STRIDE_T(I, i, n) {
    const I pl = i / n_out;
    const int o = int(i - pl * n_out);
    const int oh = o / OW, ow = o - oh * OW;
    const float* x = inp + int64_t(pl) * H * W;
    const int start = oh * st * W + ow * st;
    float best = x[start];
    int32_t best_i = start;
    for (int a = 0; a < k; ++a)
      for (int b = 0; b < k; ++b) {
        const int idx = start + a * W + b;
        const float v = x[idx];
        if (v > best || v != v) {
          best = v;
          best_i = idx;
        }
      }
    out[i] = best;
    argmax[i] = best_i;
  }
}

// One thread per input element: the sum of dout over the windows that contain it and whose
// max it was, windows in increasing output order (the CPU's scatter order), starting from 0.
// No atomics, no zeroing pass, deterministic.
template <typename I>
__global__ void maxpool_backward_kernel(float* dinp, const float* dout, const int32_t* argmax,
                                        I n, int H, int W, int OH, int OW, int k, int st) {
  const int n_in = H * W;
  STRATA_GRID_STRIDE_T(I, i, n) {
    const I pl = i / n_in;
    const int idx = int(i - pl * n_in);
    const int h = idx / W, w = idx - h * W;
    // Windows oh with oh*st <= h <= oh*st + k - 1, clipped to [0, OH).
    const int oh0 = h < k ? 0 : (h - k + st) / st, oh1 = min(OH - 1, h / st);
    const int ow0 = w < k ? 0 : (w - k + st) / st, ow1 = min(OW - 1, w / st);
    const float* dy = dout + int64_t(pl) * OH * OW;
    const int32_t* am = argmax + int64_t(pl) * OH * OW;
    float g = 0.f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const int o = oh * OW + ow;
        if (am[o] == idx) g += dy[o];
      }
    dinp[i] = g;
  }
}

}  // namespace

// inp (B,C,H,W) -> out (B,C,OH,OW), argmax (B,C,OH,OW) = index in the (H,W) plane
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int B, int C, int H, int W,
                       int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C, n = planes * OH * OW;
  if (n <= 0 || OH <= 0 || OW <= 0) return;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    maxpool_forward_kernel<I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        out, argmax, inp, I(n), H, W, OH, OW, k, st);
  });
  STRATA_CUDA_LAUNCHED();
}

// dout (B,C,OH,OW), argmax (B,C,OH,OW) -> dinp (B,C,H,W), overwritten
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int B, int C,
                        int H, int W, int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C, n = planes * H * W;
  if (n <= 0) return;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    maxpool_backward_kernel<I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        dinp, dout, argmax, I(n), H, W, OH, OW, k, st);
  });
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
