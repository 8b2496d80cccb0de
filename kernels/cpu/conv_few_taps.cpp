// A convolution's products when each output sums few taps (CK <= 16), on AVX-512.
//
// forward: 16 output positions at a time hold their CK inputs in registers; each output
// channel is CK fused multiply-adds of a broadcast weight, in k order from 0, from the bias or
// from y, 8 channels at once for independent chains. weight gradient: 16 lanes of partial sums
// per (channel, tap) over the positions, two channels at once (one when CK > 12: registers),
// then each lane set added as a fixed tree. The sums' order differs from sgemm's, so results
// differ from it in the last bits (both are fp32 sums of the same products); it is the same
// on every run and thread count: threads split output positions (forward) or channel pairs
// (gradient), never a sum.
#include "conv_few_taps.h"

#include <array>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata::cpu {
namespace {

// Products (OC x n x CK multiply-adds) below which threads are not worth waking (the CNN's
// conv1 is 225792 a sample: threaded with --threads > 1).
constexpr int64_t kParallelMin = int64_t(1) << 15;

#if defined(__x86_64__)
#define STRATA_AVX512 __attribute__((target("avx512f")))

STRATA_AVX512 inline __mmask16 first_lanes(int64_t r) {
  return r >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << r) - 1);
}

template <int CK>
STRATA_AVX512 void forward_ck(float* y, const float* w, const float* cols, int OC, int64_t n,
                              const float* bias, bool add) {
  const int64_t blocks = (n + 15) / 16;
#pragma omp parallel for schedule(static) if (int64_t(OC) * n * CK >= kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t p = blk * 16;
    const __mmask16 m = first_lanes(n - p);
    __m512 c[CK];
    #pragma GCC unroll 16
    for (int k = 0; k < CK; ++k) c[k] = _mm512_maskz_loadu_ps(m, cols + k * n + p);
    for (int o = 0; o < OC; o += 8) {
      __m512 acc[8];
      #pragma GCC unroll 16
      for (int j = 0; j < 8; ++j)
        acc[j] = add    ? _mm512_maskz_loadu_ps(m, y + (o + j) * n + p)
                 : bias ? _mm512_set1_ps(bias[o + j])
                        : _mm512_setzero_ps();
      #pragma GCC unroll 16
      for (int k = 0; k < CK; ++k)
        #pragma GCC unroll 16
        for (int j = 0; j < 8; ++j)
          acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[(o + j) * CK + k]), c[k], acc[j]);
      #pragma GCC unroll 16
      for (int j = 0; j < 8; ++j) _mm512_mask_storeu_ps(y + (o + j) * n + p, m, acc[j]);
    }
  }
}

// GCC 12's AVX-512 shuffle intrinsics pass _mm512_undefined_ps() as their unused source, which
// -Wuninitialized flags inside the header (GCC bug 105593): off for this function only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The 16 lanes' sum as a fixed tree: lane l plus lane l + 8, then l + 4, l + 2, l + 1.
STRATA_AVX512 inline float lane_sum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // 256-bit halves swapped
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // 128-bit quarters within them
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));        // pairs of floats
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));        // neighbours
  return _mm512_cvtss_f32(v);
}
#pragma GCC diagnostic pop

// The lanes added one after another from 0, as sum_floats (conv.cpp) totals its 16 partial
// sums: a bias gradient fused here has the bits it had there.
STRATA_AVX512 inline float lane_sum_in_order(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float total = 0.f;
  for (float x : t) total += x;
  return total;
}

// R channels of the gradient: acc[r][k] over the positions, 16 lanes each; with Bias, each
// channel's dy summed too (lane l holds positions l, l + 16, ...: sum_floats' partial sums).
template <int CK, int R, bool Bias>
STRATA_AVX512 void weight_grad_rows(float* dw, float* dbias, const float* dy, const float* cols,
                                    int o, int64_t n, bool add) {
  __m512 acc[R][CK], accb[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    accb[r] = _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int k = 0; k < CK; ++k) acc[r][k] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < n; p += 16) {
    const __mmask16 m = first_lanes(n - p);
    __m512 d[R];
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      d[r] = _mm512_maskz_loadu_ps(m, dy + (o + r) * n + p);
      if constexpr (Bias) accb[r] = _mm512_add_ps(accb[r], d[r]);
    }
    #pragma GCC unroll 16
    for (int k = 0; k < CK; ++k) {
      const __m512 c = _mm512_maskz_loadu_ps(m, cols + k * n + p);
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][k] = _mm512_fmadd_ps(d[r], c, acc[r][k]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 16
    for (int k = 0; k < CK; ++k) {
      const float s = lane_sum(acc[r][k]);
      float& out = dw[(o + r) * CK + k];
      out = add ? out + s : s;
    }
    if constexpr (Bias) dbias[o + r] += lane_sum_in_order(accb[r]);
  }
}

template <int CK>
STRATA_AVX512 void weight_grad_ck(float* dw, float* dbias, const float* dy, const float* cols,
                                  int OC, int64_t n, bool add) {
  constexpr int R = CK <= 12 ? 2 : 1;  // R x (CK + 1) sums, R rows of dy, a column: 32 registers
#pragma omp parallel for schedule(static) if (int64_t(OC) * n * CK >= kParallelMin)
  for (int o = 0; o < OC; o += R)
    dbias ? weight_grad_rows<CK, R, true>(dw, dbias, dy, cols, o, n, add)
          : weight_grad_rows<CK, R, false>(dw, dbias, dy, cols, o, n, add);
}

using Forward = void (*)(float*, const float*, const float*, int, int64_t, const float*, bool);
using WeightGrad = void (*)(float*, float*, const float*, const float*, int, int64_t, bool);
template <size_t... I>
constexpr std::array<Forward, sizeof...(I)> forward_table(std::index_sequence<I...>) {
  return {&forward_ck<int(I) + 1>...};
}
template <size_t... I>
constexpr std::array<WeightGrad, sizeof...(I)> weight_grad_table(std::index_sequence<I...>) {
  return {&weight_grad_ck<int(I) + 1>...};
}
constexpr auto kForward = forward_table(std::make_index_sequence<16>{});
constexpr auto kWeightGrad = weight_grad_table(std::make_index_sequence<16>{});
#endif

}  // namespace

bool few_taps_applies(int OC, int64_t CK) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && CK >= 1 && CK <= 16 && OC > 0 && OC % 8 == 0;
#else
  (void)OC, (void)CK;
  return false;
#endif
}

void few_taps_forward(float* y, const float* weight, const float* cols, int OC, int64_t n,
                      int64_t CK, const float* bias, bool add) {
#if defined(__x86_64__)
  kForward[size_t(CK - 1)](y, weight, cols, OC, n, bias, add);
#else
  (void)y, (void)weight, (void)cols, (void)OC, (void)n, (void)CK, (void)bias, (void)add;
#endif
}

void few_taps_weight_grad(float* dweight, float* dbias, const float* dy, const float* cols, int OC,
                          int64_t n, int64_t CK, bool add) {
#if defined(__x86_64__)
  kWeightGrad[size_t(CK - 1)](dweight, dbias, dy, cols, OC, n, add);
#else
  (void)dweight, (void)dbias, (void)dy, (void)cols, (void)OC, (void)n, (void)CK, (void)add;
#endif
}

}  // namespace strata::cpu
