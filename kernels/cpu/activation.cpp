// Elementwise activations: ReLU as plain loops that -O3 vectorises; GELU on explicit vectors
// (see below).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dispatch.h"
#include "lanes.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

// inp (n) -> out (n). x < 0 ? 0 : x keeps NaN (like PyTorch) and compiles to maxps.
void relu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] < 0.f ? 0.f : inp[i];
}

// dout (n), out (n) -> dinp (n). Uses the forward output, so the input need not be kept.
// dout is loaded unconditionally: with the load inside the ?: GCC keeps a branch (it may not
// add a load the source does not make), which mispredicts on random signs (~10x slower).
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = dout[i];
    dinp[i] = out[i] > 0.f ? d : 0.f;
  }
}

// ---- SiLU --------------------------------------------------------------------------------
// silu(x) = x * s(x), s = 1 / (1 + e^-x); silu'(x) = s(x) * (1 + x * (1 - s(x))). One libm
// exp per element, in float.
void silu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] / (1.f + std::exp(-inp[i]));
}

void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i], s = 1.f / (1.f + std::exp(-x));
    dinp[i] = dout[i] * s * (1.f + x * (1.f - s));
  }
}

// ---- GELU --------------------------------------------------------------------------------
// Exact GELU (PyTorch's nn.GELU(), approximate='none'): gelu(x) = x * Phi(x), with Phi the
// standard normal CDF, Phi(x) = erfc(-x/sqrt 2) / 2.
//
// Why not std::erf: without -ffast-math GCC calls the scalar libm erff (and expf in backward)
// once per element; on the benchmark GPT that was 20-25% of a training step. Here Phi is
// computed on W lanes at once from one erfc formula for the whole range, no branches:
//   erfc(a) = t * exp(-a^2 + P(t)),  t = 1 / (1 + a/2),  a = |z| >= 0,
// P a degree-9 polynomial (Numerical Recipes' erfcc, a Chebyshev fit: relative error below
// 1.2e-7 for every a, measured 1.05e-7 in double), and erfc(-a) = 2 - erfc(a). So for x < 0,
// Phi = erfc(a)/2 keeps its relative precision far into the tail (the reference's
// (1 + erf(z))/2 loses it to cancellation), and for x >= 0, Phi = 1 - erfc(a)/2.
// The exp is Cephes' expf polynomial, the softmax's (lanes.h: within 2 ulp; arguments below
// -87.3 give 0, where Phi < 1e-38 anyway).
//
// The lane code is written once over GCC vector types and compiled for AVX-512 (W = 16),
// AVX2 (W = 8) and baseline x86-64 (W = 4), picked at run time as the other kernels do. Every
// element goes through the same operations whatever W (no sums across lanes), so results do
// not depend on the thread count; they may differ in the last bit between machines where the
// compiler fuses multiply-adds (AVX-512 has FMA, baseline x86-64 does not).
// Against the scalar std::erf form: |Phi - Phi_ref| <= ~2e-7 absolute everywhere (see
// tests/ops/elementwise.cpp, "gelu: vectorised ... ").

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2*pi)

// The shared lane operations (exp_nonpos: attention.cpp's softmax exp), plus Phi and GELU.
template <int W>
struct GeluLanes : simd::Lanes<W> {
  using Base = simd::Lanes<W>;
  using F = typename Base::F;
  using Base::exp_nonpos;
  using Base::splat;

  // Phi(x) = erfc(-x/sqrt 2) / 2 (see the note above). NaN gives NaN.
  static STRATA_INLINE F phi_cdf(const F& x) {
    const F z = x * kInvSqrt2;
    const F a = z < 0.f ? -z : z;
    const F t = 1.f / (a * 0.5f + 1.f);
    F p = splat(0.17087277f);
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    // a^2 as x*x/2: one rounding (z*z would add z's), which sets the tail's relative error.
    const F half_erfc = t * 0.5f * exp_nonpos(p - x * x * 0.5f);  // erfc(a) / 2
    return x < 0.f ? half_erfc : 1.f - half_erfc;
  }

  static STRATA_INLINE F forward(const F& x) { return x * phi_cdf(x); }

  // gelu'(x) = Phi(x) + x * phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi).
  static STRATA_INLINE F derivative(const F& x) {
    const F pdf = exp_nonpos(x * x * -0.5f) * kInvSqrt2Pi;
    return phi_cdf(x) + x * pdf;
  }
  static STRATA_INLINE F backward(const F& dy, const F& x) { return dy * derivative(x); }
};

// GPT-2's tanh GELU: gelu(x) = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3).
// tanh from the same exp: tanh(|u|) = (1 - e) / (1 + e), e = exp(-2|u|) in (0, 1], so nothing
// overflows; the odd symmetry gives the sign. Near u = 0, 1 - e loses bits to cancellation, but
// only ~1e-7 absolute in tanh, which the 1 + tanh(u) that follows cannot see.
template <int W>
struct GeluTanhLanes : simd::Lanes<W> {
  using Base = simd::Lanes<W>;
  using F = typename Base::F;
  using Base::exp_nonpos;

  static constexpr float kSqrt2OverPi = 0.79788456080286536f, kCubic = 0.044715f;

  static STRATA_INLINE F tanh_of(const F& u) {
    const F a = u < 0.f ? -u : u;
    const F e = exp_nonpos(a * -2.f);
    const F t = (1.f - e) / (1.f + e);
    return u < 0.f ? -t : t;
  }
  static STRATA_INLINE F forward(const F& x) {
    const F t = tanh_of((x + x * x * x * kCubic) * kSqrt2OverPi);
    return x * 0.5f * (1.f + t);
  }
  // gelu'(x) = (1 + t)/2 + x/2 * (1 - t^2) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2).
  static STRATA_INLINE F derivative(const F& x) {
    const F x2 = x * x;
    const F t = tanh_of((x + x2 * x * kCubic) * kSqrt2OverPi);
    const F du = (x2 * (3.f * kCubic) + 1.f) * kSqrt2OverPi;
    return (1.f + t) * 0.5f + x * 0.5f * (1.f - t * t) * du;
  }
  static STRATA_INLINE F backward(const F& dy, const F& x) { return dy * derivative(x); }
};

// Elements [i0, i1) through the lane form V (GeluLanes or GeluTanhLanes): kGroup vectors at a
// time, then single vectors, then the last partial one through a stack buffer. One vector's
// GELU is a chain of ~40 dependent operations (the erfc polynomial, exp, a division) that the
// core cannot overlap with the next vector's by itself: the group's independent chains,
// interleaved by GCC's scheduling before register allocation (-fschedule-insns, set for the
// kernels in CMakeLists.txt), run forward 1.40x and backward 1.43x faster on an AMD EPYC Zen 5
// (0.53 -> 0.38 and 0.68 -> 0.48 ns an element, one thread; either change alone: 1.15x at most).
// Every element still goes through the same operations: results are bitwise those of one
// vector at a time.
constexpr int kGroup = 4;

template <class V, int W>
STRATA_INLINE void forward_range(float* out, const float* inp, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + kGroup * W <= i1; i += kGroup * W) {
    typename V::F y[kGroup];
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g) y[g] = V::forward(V::load(inp + i + g * W));
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g) V::store(out + i + g * W, y[g]);
  }
  for (; i + W <= i1; i += W) V::store(out + i, V::forward(V::load(inp + i)));
  if (i < i1) {
    const int n = int(i1 - i);
    float buf[W] = {};
    std::memcpy(buf, inp + i, sizeof(float) * size_t(n));
    V::store(buf, V::forward(V::load(buf)));
    std::memcpy(out + i, buf, sizeof(float) * size_t(n));
  }
}

template <class V, int W>
STRATA_INLINE void backward_range(float* dinp, const float* dout, const float* inp, int64_t i0,
                                  int64_t i1) {
  int64_t i = i0;
  for (; i + kGroup * W <= i1; i += kGroup * W) {
    typename V::F d[kGroup];
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g)
      d[g] = V::backward(V::load(dout + i + g * W), V::load(inp + i + g * W));
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g) V::store(dinp + i + g * W, d[g]);
  }
  for (; i + W <= i1; i += W)
    V::store(dinp + i, V::backward(V::load(dout + i), V::load(inp + i)));
  if (i < i1) {
    const int n = int(i1 - i);
    float bx[W] = {}, bd[W] = {};
    std::memcpy(bx, inp + i, sizeof(float) * size_t(n));
    std::memcpy(bd, dout + i, sizeof(float) * size_t(n));
    V::store(bd, V::backward(V::load(bd), V::load(bx)));
    std::memcpy(dinp + i, bd, sizeof(float) * size_t(n));
  }
}

// forward_range that also writes each element's derivative, the factor backward multiplies
// dout by (grad may be inp: each group is loaded whole before anything is stored).
template <class V, int W>
STRATA_INLINE void forward_grad_range(float* out, float* grad, const float* inp, int64_t i0,
                                      int64_t i1) {
  int64_t i = i0;
  for (; i + kGroup * W <= i1; i += kGroup * W) {
    typename V::F x[kGroup];
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g) x[g] = V::load(inp + i + g * W);
#pragma GCC unroll 4
    for (int g = 0; g < kGroup; ++g) {
      V::store(out + i + g * W, V::forward(x[g]));
      V::store(grad + i + g * W, V::derivative(x[g]));
    }
  }
  if (i < i1) {  // the rest one vector at a time, the last one partial, through stack buffers
    for (; i < i1; i += W) {
      const int n = int(std::min<int64_t>(W, i1 - i));
      float bx[W] = {}, by[W], bg[W];
      std::memcpy(bx, inp + i, sizeof(float) * size_t(n));
      V::store(by, V::forward(V::load(bx)));
      V::store(bg, V::derivative(V::load(bx)));
      std::memcpy(out + i, by, sizeof(float) * size_t(n));
      std::memcpy(grad + i, bg, sizeof(float) * size_t(n));
    }
  }
}

using GeluForwardRange = void (*)(float*, const float*, int64_t, int64_t);
using GeluForwardGradRange = void (*)(float*, float*, const float*, int64_t, int64_t);
using GeluBackwardRange = void (*)(float*, const float*, const float*, int64_t, int64_t);

#define STRATA_GELU_VARIANT(suffix, attr, W)                                                  \
  attr void gelu_forward_##suffix(float* out, const float* inp, int64_t i0, int64_t i1) {     \
    forward_range<GeluLanes<W>, W>(out, inp, i0, i1);                                         \
  }                                                                                           \
  attr void gelu_backward_##suffix(float* dinp, const float* dout, const float* inp,          \
                                   int64_t i0, int64_t i1) {                                  \
    backward_range<GeluLanes<W>, W>(dinp, dout, inp, i0, i1);                                 \
  }                                                                                           \
  attr void gelu_tanh_forward_##suffix(float* out, const float* inp, int64_t i0, int64_t i1) {\
    forward_range<GeluTanhLanes<W>, W>(out, inp, i0, i1);                                     \
  }                                                                                           \
  attr void gelu_tanh_backward_##suffix(float* dinp, const float* dout, const float* inp,     \
                                        int64_t i0, int64_t i1) {                             \
    backward_range<GeluTanhLanes<W>, W>(dinp, dout, inp, i0, i1);                             \
  }                                                                                           \
  attr void gelu_forward_grad_##suffix(float* out, float* grad, const float* inp, int64_t i0, \
                                       int64_t i1) {                                          \
    forward_grad_range<GeluLanes<W>, W>(out, grad, inp, i0, i1);                              \
  }                                                                                           \
  attr void gelu_tanh_forward_grad_##suffix(float* out, float* grad, const float* inp,        \
                                            int64_t i0, int64_t i1) {                         \
    forward_grad_range<GeluTanhLanes<W>, W>(out, grad, inp, i0, i1);                          \
  }                                                                                           \
  attr void gelu_backward_kept_##suffix(float* dinp, const float* dout, const float* grad,    \
                                        int64_t i0, int64_t i1) {                             \
    for (int64_t i = i0; i < i1; ++i) dinp[i] = dout[i] * grad[i];                            \
  }

STRATA_ISA_VARIANTS(STRATA_GELU_VARIANT, "avx2,fma")

// Elements per OpenMP work item (a multiple of 16), and the size below which threads are not
// worth waking.
constexpr int64_t kGeluChunk = int64_t(1) << 14;
constexpr int64_t kParallelMin = int64_t(1) << 15;

// Every GELU entry point: `range` over chunks of the elements, threaded for large n.
template <class Range, class... Ptrs>
void chunked(Range range, int64_t n, Ptrs... p) {
  const int64_t chunks = (n + kGeluChunk - 1) / kGeluChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) range(p..., c * kGeluChunk, std::min(n, (c + 1) * kGeluChunk));
}

}  // namespace

// inp (n) -> out (n); gelu(x) = x * Phi(x) = x/2 * (1 + erf(x/sqrt 2)).
void gelu_forward(float* out, const float* inp, int64_t n) {
  static const GeluForwardRange range =
      pick_isa(gelu_forward_avx512, gelu_forward_avx2, gelu_forward_generic, /*avx2_needs_fma=*/true);
  chunked(range, n, out, inp);
}

// dout (n), inp (n) -> dinp (n); gelu'(x) = Phi(x) + x * phi(x), phi the normal density.
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  static const GeluBackwardRange range =
      pick_isa(gelu_backward_avx512, gelu_backward_avx2, gelu_backward_generic, true);
  chunked(range, n, dinp, dout, inp);
}

// inp (n) -> out (n); the tanh form (GeluTanhLanes).
void gelu_tanh_forward(float* out, const float* inp, int64_t n) {
  static const GeluForwardRange range =
      pick_isa(gelu_tanh_forward_avx512, gelu_tanh_forward_avx2, gelu_tanh_forward_generic, true);
  chunked(range, n, out, inp);
}

// dout (n), inp (n) -> dinp (n); the tanh form's derivative.
void gelu_tanh_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  static const GeluBackwardRange range =
      pick_isa(gelu_tanh_backward_avx512, gelu_tanh_backward_avx2, gelu_tanh_backward_generic, true);
  chunked(range, n, dinp, dout, inp);
}

// The forward that keeps its derivative for backward (gelu_forward_grad), and that backward: the
// same operations as gelu_forward and gelu_backward, split where backward multiplies dout by
// the derivative, so every result is bitwise theirs. The erfc and the second exp then run once,
// in forward, beside the forward's own (the same erfc: computed once), where backward ran them
// all again; backward is a multiply, bound by memory. On the GPT's MLP (2048 x 1536, one
// thread, AMD EPYC Zen 5, inputs cold) forward and backward took 2.9 ms, now 2.45 (forward
// 1.29 -> 1.65, backward 1.63 -> 0.81); in the GPT bf16 step's profile GELU fell from 4.54 to
// 3.98 %.
void gelu_forward_grad(float* out, float* grad, const float* inp, int64_t n) {
  static const GeluForwardGradRange range =
      pick_isa(gelu_forward_grad_avx512, gelu_forward_grad_avx2, gelu_forward_grad_generic, true);
  chunked(range, n, out, grad, inp);
}

void gelu_tanh_forward_grad(float* out, float* grad, const float* inp, int64_t n) {
  static const GeluForwardGradRange range = pick_isa(
      gelu_tanh_forward_grad_avx512, gelu_tanh_forward_grad_avx2, gelu_tanh_forward_grad_generic,
      true);
  chunked(range, n, out, grad, inp);
}

// dinp = dout * grad, element by element.
void gelu_backward_kept(float* dinp, const float* dout, const float* grad, int64_t n) {
  static const GeluBackwardRange range =
      pick_isa(gelu_backward_kept_avx512, gelu_backward_kept_avx2, gelu_backward_kept_generic);
  chunked(range, n, dinp, dout, grad);
}

// The scalar forms, std::erf and std::exp per element: the reference the tests hold the
// vectorised kernels to.
void gelu_forward_reference(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = x * 0.5f * (1.f + std::erf(x * kInvSqrt2));
  }
}

void gelu_backward_reference(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

// x (rows, cols) += bias (cols) on every row.
void add_bias_rows(float* x, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + int64_t(r) * cols;
    for (int c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

}  // namespace strata::cpu
