// Max pooling without padding. Forward records where each max came from, so backward never
// re-reads the input.
#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

// The window scans use selects, not branches: which element is the max is random, so a branch
// would mispredict often (a branchy 3x3 scan measured 3-4x slower).
inline void take_max(float& best, int32_t& best_i, float v, int32_t idx) {
  const bool take = v > best || v != v;  // strict: ties keep the first; NaN wins
  best = take ? v : best;
  best_i = take ? idx : best_i;
}

#if defined(__SSE2__)
// Lanes where mask is set take a, the others b.
inline __m128 select(__m128 mask, __m128 a, __m128 b) {
  return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b));
}
inline __m128i select(__m128i mask, __m128i a, __m128i b) {
  return _mm_or_si128(_mm_and_si128(mask, a), _mm_andnot_si128(mask, b));
}
// take_max's rule for 4 lanes: v replaces best if strictly greater, or NaN.
inline __m128 takes(__m128 v, __m128 best) {
  return _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
}
#endif

// 2x2 windows, stride 2 (the common case). Four windows at a time with SSE2: GCC does not
// vectorise the strided window scan itself, and the scalar scan was 13% of a CNN step.
// Pairs are compared (a,b), (c,d), then the winners: the same result and tie rule as the
// sequential take_max scan below (a later element wins only if strictly greater, or NaN).
void maxpool_plane_2x2(float* y, int32_t* am, const float* x, int W, int OH, int OW) {
  for (int oh = 0; oh < OH; ++oh) {
    const float* r0 = x + 2 * oh * W;
    const float* r1 = r0 + W;
    float* yr = y + oh * OW;
    int32_t* ar = am + oh * OW;
    const int32_t base = 2 * oh * W;
    int ow = 0;
#if defined(__SSE2__)
    const __m128i lane2 = _mm_setr_epi32(0, 2, 4, 6), one = _mm_set1_epi32(1);
    const __m128i row1 = _mm_set1_epi32(W);
    for (; ow + 4 <= OW; ow += 4) {
      const __m128 p0 = _mm_loadu_ps(r0 + 2 * ow), p1 = _mm_loadu_ps(r0 + 2 * ow + 4);
      const __m128 q0 = _mm_loadu_ps(r1 + 2 * ow), q1 = _mm_loadu_ps(r1 + 2 * ow + 4);
      const __m128 a = _mm_shuffle_ps(p0, p1, _MM_SHUFFLE(2, 0, 2, 0));  // even columns
      const __m128 b = _mm_shuffle_ps(p0, p1, _MM_SHUFFLE(3, 1, 3, 1));  // odd columns
      const __m128 c = _mm_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0));
      const __m128 d = _mm_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));
      const __m128 tb = takes(b, a), td = takes(d, c);
      const __m128 m1 = select(tb, b, a), m2 = select(td, d, c);
      const __m128 t2 = takes(m2, m1);
      _mm_storeu_ps(yr + ow, select(t2, m2, m1));
      const __m128i ib = _mm_and_si128(_mm_castps_si128(tb), one);
      const __m128i id = _mm_add_epi32(row1, _mm_and_si128(_mm_castps_si128(td), one));
      const __m128i off = select(_mm_castps_si128(t2), id, ib);
      const __m128i col = _mm_add_epi32(_mm_set1_epi32(base + 2 * ow), lane2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(ar + ow), _mm_add_epi32(col, off));
    }
#endif
    for (; ow < OW; ++ow) {
      const int i = 2 * oh * W + 2 * ow;
      float best = x[i];
      int32_t best_i = i;
      take_max(best, best_i, x[i + 1], i + 1);
      take_max(best, best_i, x[i + W], i + W);
      take_max(best, best_i, x[i + W + 1], i + W + 1);
      yr[ow] = best;
      ar[ow] = best_i;
    }
  }
}

#if defined(__x86_64__)
// The 2x2 windows with AVX-512: up to 16 windows of a row per round (32 input columns, the
// even and odd ones split by permutes), the row's end by masks instead of a scalar tail. The
// CNN's rows are 14 and 7 windows wide: the SSE2 loop above ran 3 and 1 rounds there plus 2
// and 3 scalar windows, and pooling was 11 % of a CNN step (perf, AMD EPYC family 25). Same
// comparisons in the same order as the SSE2 and scalar paths, so the same bits and argmax.
// take_max's rule for 16 lanes: v replaces best where strictly greater, or NaN.
__attribute__((target("avx512f"))) inline __mmask16 takes16(__m512 v, __m512 best) {
  return __mmask16(_mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) |
                   _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
}

// Whole: the plane is not the buffer's last (whole_after below), so every access may be a
// whole vector: loads past a row read the next rows' values, and stores past an output row
// write lanes the next row (or plane) overwrites after, being written in address order. Rows of
// 14 and 7 windows then need no masked loads or stores, which are slow on AMD's cores (with
// them pooling was 11.6 % of the CNN's step on Zen 5).
template <bool Whole>
__attribute__((target("avx512f"))) inline __m512 load16(__mmask16 m, const float* p) {
  return Whole ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

template <bool Whole>
__attribute__((target("avx512f"))) void maxpool_plane_2x2_avx512(float* y, int32_t* am,
                                                                const float* x, int W, int OH,
                                                                int OW) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i one = _mm512_set1_epi32(1), row1 = _mm512_set1_epi32(W);
  for (int oh = 0; oh < OH; ++oh) {
    const float* r0 = x + 2 * oh * W;
    const float* r1 = r0 + W;
    const int32_t base = 2 * oh * W;
    for (int ow = 0; ow < OW; ow += 16) {
      const int n = std::min(16, OW - ow), cols = 2 * n;
      const __mmask16 lo = cols >= 16 ? 0xFFFF : __mmask16((1u << cols) - 1);
      const __mmask16 hi = cols <= 16 ? 0 : __mmask16((1u << (cols - 16)) - 1);
      const __mmask16 out = __mmask16((1u << n) - 1);
      const __m512 p0 = load16<Whole>(lo, r0 + 2 * ow), p1 = load16<Whole>(hi, r0 + 2 * ow + 16);
      const __m512 q0 = load16<Whole>(lo, r1 + 2 * ow), q1 = load16<Whole>(hi, r1 + 2 * ow + 16);
      const __m512 a = _mm512_permutex2var_ps(p0, even, p1), b = _mm512_permutex2var_ps(p0, odd, p1);
      const __m512 c = _mm512_permutex2var_ps(q0, even, q1), d = _mm512_permutex2var_ps(q0, odd, q1);
      const __mmask16 tb = takes16(b, a), td = takes16(d, c);
      const __m512 m1 = _mm512_mask_blend_ps(tb, a, b), m2 = _mm512_mask_blend_ps(td, c, d);
      const __mmask16 t2 = takes16(m2, m1);
      const __m512 best = _mm512_mask_blend_ps(t2, m1, m2);
      const __m512i ib = _mm512_maskz_mov_epi32(tb, one);
      const __m512i id = _mm512_mask_add_epi32(row1, td, row1, one);
      const __m512i col = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow), even);
      const __m512i at = _mm512_add_epi32(col, _mm512_mask_blend_epi32(t2, ib, id));
      if constexpr (Whole) {
        _mm512_storeu_ps(y + oh * OW + ow, best);
        _mm512_storeu_si512(am + oh * OW + ow, at);
      } else {
        _mm512_mask_storeu_ps(y + oh * OW + ow, out, best);
        _mm512_mask_storeu_epi32(am + oh * OW + ow, out, at);
      }
    }
  }
}
#endif

// Any window: window offsets in the outer loops, the output row in the inner one, with the
// running max kept in the output row itself (a short, branch-free inner loop). Offsets are
// visited in row-major window order, so ties resolve as in the 2x2 case.
void maxpool_plane(float* y, int32_t* am, const float* x, int W, int OH, int OW, int k, int st) {
  for (int oh = 0; oh < OH; ++oh) {
    float* yr = y + oh * OW;
    int32_t* ar = am + oh * OW;
    const int row0 = oh * st * W;
    for (int ow = 0; ow < OW; ++ow) {
      yr[ow] = x[row0 + ow * st];
      ar[ow] = row0 + ow * st;
    }
    for (int i = 0; i < k; ++i)
      for (int j = i == 0 ? 1 : 0; j < k; ++j) {
        const int off = row0 + i * W + j;
        for (int ow = 0; ow < OW; ++ow) take_max(yr[ow], ar[ow], x[off + ow * st], off + ow * st);
      }
  }
}

// Whether whole-vector accesses may run past a plane: at least a vector of outputs (16) and
// two of inputs (32, a window row pair's reach) follow it in the buffers.
bool whole_after(int64_t planes_after, int64_t n_in, int64_t n_out) {
  return planes_after * n_in >= 32 && planes_after * n_out >= 16;
}

// The 2x2 windows on this CPU's widest path (each gives the same values and argmax).
void maxpool_plane_2x2_best(float* y, int32_t* am, const float* x, int W, int OH, int OW,
                            bool whole) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    return whole ? maxpool_plane_2x2_avx512<true>(y, am, x, W, OH, OW)
                 : maxpool_plane_2x2_avx512<false>(y, am, x, W, OH, OW);
#endif
  maxpool_plane_2x2(y, am, x, W, OH, OW);
}

}  // namespace

// inp (B,C,H,W) -> out (B,C,OH,OW), argmax (B,C,OH,OW) = index in the (H,W) plane.
// Ties keep the first element in row-major window order; a NaN wins (as in PyTorch).
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int B, int C, int H, int W,
                       int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C, n_out = int64_t(OH) * OW;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* x = inp + pl * H * W;
    if (k == 2 && st == 2)
      maxpool_plane_2x2_best(out + pl * n_out, argmax + pl * n_out, x, W, OH, OW,
                             whole_after(planes - 1 - pl, int64_t(H) * W, n_out));
    else
      maxpool_plane(out + pl * n_out, argmax + pl * n_out, x, W, OH, OW, k, st);
  }
}

namespace {

// 2x2 windows, stride 2: the windows tile the plane, so every input element is written exactly
// once (the gradient where it was its window's max, else 0) with no separate zeroing pass.
// Written for k = 2 only: a runtime window size here measured 4x slower than the generic
// zero-and-scatter path.
void maxpool_plane_backward_2x2(float* dx, const float* dy, const int32_t* am, int H, int W,
                                int OH, int OW) {
  for (int oh = 0; oh < OH; ++oh)
    for (int i = 0; i < 2; ++i) {
      const int row = (2 * oh + i) * W;
      for (int ow = 0; ow < OW; ++ow) {
        const float g = dy[oh * OW + ow];
        const int32_t a = am[oh * OW + ow] - (row + 2 * ow);  // offset of the max in this row
        dx[row + 2 * ow] = a == 0 ? g : 0.f;
        dx[row + 2 * ow + 1] = a == 1 ? g : 0.f;
      }
      std::fill(dx + row + 2 * OW, dx + row + W, 0.f);  // a last odd column
    }
  std::fill(dx + 2 * OH * W, dx + H * W, 0.f);  // a last odd row
}


#if defined(__x86_64__)
// The same with AVX-512: 16 windows of a row per round, the gradient and zeros of the even and
// odd columns interleaved by permutes and stored as 32 contiguous floats (masked at the end).
template <bool Whole>  // as in maxpool_plane_2x2_avx512
__attribute__((target("avx512f"))) void maxpool_plane_backward_2x2_avx512(
    float* dx, const float* dy, const int32_t* am, int H, int W, int OH, int OW) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  for (int oh = 0; oh < OH; ++oh)
    for (int i = 0; i < 2; ++i) {
      const int row = (2 * oh + i) * W;
      for (int ow = 0; ow < OW; ow += 16) {
        const int n = std::min(16, OW - ow), cols = 2 * n;
        const __mmask16 in = __mmask16((1u << n) - 1);
        const __mmask16 lo = cols >= 16 ? 0xFFFF : __mmask16((1u << cols) - 1);
        const __mmask16 hi = cols <= 16 ? 0 : __mmask16((1u << (cols - 16)) - 1);
        const float* gp = dy + oh * OW + ow;
        const int32_t* ap = am + oh * OW + ow;
        const __m512 g = load16<Whole>(in, gp);
        const __m512i col = _mm512_add_epi32(_mm512_set1_epi32(row + 2 * ow), even);
        const __m512i at = Whole ? _mm512_loadu_si512(ap) : _mm512_maskz_loadu_epi32(in, ap);
        const __m512i a = _mm512_sub_epi32(at, col);
        const __m512 e = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, zero), g);
        const __m512 o = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(a, one), g);
        const __m512 v0 = _mm512_permutex2var_ps(e, first, o), v1 = _mm512_permutex2var_ps(e, second, o);
        if constexpr (Whole) {
          _mm512_storeu_ps(dx + row + 2 * ow, v0);
          if (cols > 16) _mm512_storeu_ps(dx + row + 2 * ow + 16, v1);
        } else {
          _mm512_mask_storeu_ps(dx + row + 2 * ow, lo, v0);
          _mm512_mask_storeu_ps(dx + row + 2 * ow + 16, hi, v1);
        }
      }
      std::fill(dx + row + 2 * OW, dx + row + W, 0.f);  // a last odd column
    }
  std::fill(dx + 2 * OH * W, dx + H * W, 0.f);  // a last odd row
}
#endif

void maxpool_plane_backward_2x2_best(float* dx, const float* dy, const int32_t* am, int H, int W,
                                     int OH, int OW, bool whole) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    return whole ? maxpool_plane_backward_2x2_avx512<true>(dx, dy, am, H, W, OH, OW)
                 : maxpool_plane_backward_2x2_avx512<false>(dx, dy, am, H, W, OH, OW);
#endif
  maxpool_plane_backward_2x2(dx, dy, am, H, W, OH, OW);
}

}  // namespace

// dout (B,C,OH,OW), argmax (B,C,OH,OW) -> dinp (B,C,H,W). Overlapping windows (st < k) add up.
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int B, int C,
                        int H, int W, int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C, n_out = int64_t(OH) * OW, n_in = int64_t(H) * W;
  if (k == 2 && st == 2) {
    for (int64_t pl = 0; pl < planes; ++pl)
      maxpool_plane_backward_2x2_best(dinp + pl * n_in, dout + pl * n_out, argmax + pl * n_out, H,
                                      W, OH, OW, whole_after(planes - 1 - pl, n_in, n_out));
    return;
  }
  std::fill(dinp, dinp + planes * n_in, 0.f);
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dx = dinp + pl * n_in;
    const float* dy = dout + pl * n_out;
    const int32_t* am = argmax + pl * n_out;
    for (int64_t i = 0; i < n_out; ++i) dx[am[i]] += dy[i];
  }
}

}  // namespace strata::cpu
