// LayerNorm over the last dimension (PyTorch's nn.LayerNorm(C): eps 1e-5, biased variance),
// forward and backward; and the residual add beside it (GPT-2's x + f(layernorm(x))).
//
// Rows are independent and split over OpenMP threads in fixed chunks of kRows rows. The
// parameter gradients are sums over rows: each chunk sums its rows in order into its own
// partial, and the partials are added in chunk order, so the result depends on N only, never
// on the thread count. Row sums (mean, variance, backward's two means) run on W lanes then
// add the lanes as a fixed tree; the mean is taken first and the variance from it (two passes
// over a row that is in L1), which keeps the variance of rows with a large mean, where
// E[x^2] - mean^2 loses it. The row code is compiled for AVX-512 (W = 16), AVX2 (W = 8) and
// baseline x86-64 (W = 4) and picked at run time, as in attention.cpp; the last bits of a
// result depend on W (the machine), never on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "lanes.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

constexpr float kEps = 1e-5f;  // PyTorch's default
constexpr int kRows = 64;      // rows per chunk: the unit of work and of the parameter sums

using simd::Lanes;

// One row: x (C) -> out (C), its mean and rstd (either may be null).
template <int W>
STRATA_INLINE void forward_row(float* out, float* mean, float* rstd, const float* x,
                               const float* w, const float* b, int C) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int full = C / W * W;
  F acc{};
  for (int c = 0; c < full; c += W) acc += V::load(x + c);
  float sum = V::hsum(acc);
  for (int c = full; c < C; ++c) sum += x[c];
  const float m = sum / float(C);
  F acc2{};
  for (int c = 0; c < full; c += W) {
    const F d = V::load(x + c) - m;
    acc2 += d * d;
  }
  float ss = V::hsum(acc2);
  for (int c = full; c < C; ++c) ss += (x[c] - m) * (x[c] - m);
  const float r = 1.f / std::sqrt(ss / float(C) + kEps);
  for (int c = 0; c < full; c += W)
    V::store(out + c, (V::load(x + c) - m) * r * V::load(w + c) + V::load(b + c));
  for (int c = full; c < C; ++c) out[c] = (x[c] - m) * r * w[c] + b[c];
  if (mean) *mean = m;
  if (rstd) *rstd = r;
}

// Rows [r0, r1).
template <int W>
STRATA_INLINE void forward_rows(float* out, float* mean, float* rstd, const float* inp,
                                const float* w, const float* b, int r0, int r1, int C) {
  for (int r = r0; r < r1; ++r)
    forward_row<W>(out + int64_t(r) * C, mean ? mean + r : nullptr, rstd ? rstd + r : nullptr,
                   inp + int64_t(r) * C, w, b, C);
}

// One row, with xhat = (x - m) * r and g = w * dy:
//   dx = r * (g - mean(g) - xhat * mean(g * xhat));  pw += dy * xhat;  pb += dy.
// Any of dx, pw, pb may be null.
template <int W>
STRATA_INLINE void backward_row(float* dx, float* pw, float* pb, const float* dy, const float* x,
                                const float* w, float m, float r, int C) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int full = C / W * W;
  if (dx) {
    F sg{}, sgx{};
    for (int c = 0; c < full; c += W) {
      const F g = V::load(w + c) * V::load(dy + c);
      sg += g;
      sgx += g * ((V::load(x + c) - m) * r);
    }
    float mg = V::hsum(sg), mgx = V::hsum(sgx);
    for (int c = full; c < C; ++c) {
      const float g = w[c] * dy[c];
      mg += g;
      mgx += g * ((x[c] - m) * r);
    }
    mg /= float(C);
    mgx /= float(C);
    for (int c = 0; c < full; c += W) {
      const F xh = (V::load(x + c) - m) * r;
      V::store(dx + c, (V::load(w + c) * V::load(dy + c) - mg - xh * mgx) * r);
    }
    for (int c = full; c < C; ++c) dx[c] = (w[c] * dy[c] - mg - ((x[c] - m) * r) * mgx) * r;
  }
  if (pw) {
    for (int c = 0; c < full; c += W)
      V::store(pw + c, V::load(pw + c) + V::load(dy + c) * ((V::load(x + c) - m) * r));
    for (int c = full; c < C; ++c) pw[c] += dy[c] * ((x[c] - m) * r);
  }
  if (pb) {
    for (int c = 0; c < full; c += W) V::store(pb + c, V::load(pb + c) + V::load(dy + c));
    for (int c = full; c < C; ++c) pb[c] += dy[c];
  }
}

// Rows [r0, r1); pw and pb (C each) are this chunk's parameter-gradient partials, zeroed first.
template <int W>
STRATA_INLINE void backward_rows(float* dinp, float* pw, float* pb, const float* dout,
                                 const float* inp, const float* w, const float* mean,
                                 const float* rstd, int r0, int r1, int C) {
  if (pw) std::fill(pw, pw + C, 0.f);
  if (pb) std::fill(pb, pb + C, 0.f);
  for (int r = r0; r < r1; ++r) {
    const int64_t o = int64_t(r) * C;
    backward_row<W>(dinp ? dinp + o : nullptr, pw, pb, dout + o, inp + o, w, mean[r], rstd[r],
                    C);
  }
}

using ForwardRows = void (*)(float*, float*, float*, const float*, const float*, const float*,
                             int, int, int);
using BackwardRows = void (*)(float*, float*, float*, const float*, const float*, const float*,
                              const float*, const float*, int, int, int);

#define STRATA_LN_VARIANT(suffix, attr, W)                                                    \
  attr void forward_rows_##suffix(float* out, float* mean, float* rstd, const float* inp,     \
                                  const float* w, const float* b, int r0, int r1, int C) {    \
    forward_rows<W>(out, mean, rstd, inp, w, b, r0, r1, C);                                   \
  }                                                                                           \
  attr void backward_rows_##suffix(float* dinp, float* pw, float* pb, const float* dout,      \
                                   const float* inp, const float* w, const float* mean,       \
                                   const float* rstd, int r0, int r1, int C) {                \
    backward_rows<W>(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C);                      \
  }

STRATA_ISA_VARIANTS(STRATA_LN_VARIANT, "avx2")

// Below this many elements the work is not worth waking threads for.
constexpr int64_t kParallelMin = int64_t(1) << 15;

}  // namespace

// inp (N,C), weight (C), bias (C) -> out (N,C), mean (N), rstd (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  static const ForwardRows rows =
      pick_isa(forward_rows_avx512, forward_rows_avx2, forward_rows_generic);
  const int nchunks = (N + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (int64_t(N) * C >= kParallelMin)
  for (int ch = 0; ch < nchunks; ++ch)
    rows(out, mean, rstd, inp, weight, bias, ch * kRows, std::min(N, (ch + 1) * kRows), C);
}

// dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) -> dinp (N,C), dweight (C), dbias (C)
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, bool accumulate) {
  static const BackwardRows rows =
      pick_isa(backward_rows_avx512, backward_rows_avx2, backward_rows_generic);
  const int nchunks = (N + kRows - 1) / kRows;
  const bool params = dweight || dbias;
  float* part = params ? thread_scratch(size_t(nchunks) * 2 * size_t(C)) : nullptr;
#pragma omp parallel for schedule(static) if (int64_t(N) * C >= kParallelMin)
  for (int ch = 0; ch < nchunks; ++ch) {
    float* pw = dweight ? part + int64_t(ch) * 2 * C : nullptr;
    float* pb = dbias ? part + int64_t(ch) * 2 * C + C : nullptr;
    rows(dinp, pw, pb, dout, inp, weight, mean, rstd, ch * kRows, std::min(N, (ch + 1) * kRows),
         C);
  }
  // Partials in chunk order: d = (accumulate ? d + p0 : p0) + p1 + p2 + ...
  for (int which = 0; which < 2; ++which) {
    float* d = which == 0 ? dweight : dbias;
    if (!d) continue;
    if (nchunks == 0) {
      if (!accumulate) std::fill(d, d + C, 0.f);
      continue;
    }
    const float* p = part + which * C;
    if (accumulate)
      for (int c = 0; c < C; ++c) d[c] += p[c];
    else
      std::copy(p, p + C, d);
    for (int ch = 1; ch < nchunks; ++ch) {
      const float* pc = p + int64_t(ch) * 2 * C;
      for (int c = 0; c < C; ++c) d[c] += pc[c];
    }
  }
}

// a (n), b (n) -> out (n) = a + b
void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace strata::cpu
