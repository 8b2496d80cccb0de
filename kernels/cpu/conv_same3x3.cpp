#include "conv_same3x3.h"

#include <algorithm>
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "dispatch.h"

namespace strata::cpu {
namespace {

#if defined(__x86_64__)
// A sample's input plane zero-padded by one on every side, in rows of PW floats (a whole
// number of vectors, at least W + 2), with a vector of slack after the last row: a cols row's
// output row oh is then whole vectors loaded at column kw of padded row oh + kh, no masks
// (masked loads and stores of rows that are not whole vectors ran im2col 1.3x slower than the
// general path's short copies on Zen 5).
struct PaddedPlane {
  int H, W, PW;
  float* p;
  PaddedPlane(int H_, int W_)
      : H(H_), W(W_), PW((W_ + 2 + 15) / 16 * 16),
        p(thread_scratch(size_t(PW) * (H_ + 2) + 16)) {
    std::fill(p, p + size_t(PW) * (H + 2) + 16, 0.f);
  }
  float* row(int r) const { return p + int64_t(r) * PW; }  // padded row r = input row r - 1
  // The plane `src` (H x W) inside, read as whole vectors where they stay below src_end; a
  // vector that runs past a row writes the next row's left column and its own right column,
  // which are zeroed again after.
  void fill(const float* src, const float* src_end);
};

// W floats from src to dst as whole vectors, each of which may run past the row's end: only
// a vector that would take `bounded` (src or dst) past `end` is cut short, by a copy. Rows
// written in address order overwrite what the one before ran into.
__attribute__((target("avx512f"))) inline void copy_row(float* dst, const float* src, int W,
                                                       const float* bounded, const float* end) {
  int k = 0;
  for (; k < W && bounded + k + 16 <= end; k += 16)
    _mm512_storeu_ps(dst + k, _mm512_loadu_ps(src + k));
  if (k < W) std::copy(src + k, src + W, dst + k);
}

__attribute__((target("avx512f"))) void PaddedPlane::fill(const float* src, const float* src_end) {
  for (int r = 0; r < H; ++r) {
    const float* in = src + int64_t(r) * W;
    copy_row(row(r + 1) + 1, in, W, in, src_end);
  }
  for (int r = 1; r <= H + 1; ++r) row(r)[0] = 0.f, row(r - 1)[W + 1] = 0.f;
}

__attribute__((target("avx512f"))) void im2col_avx512(float* cols, const float* inp, int nb,
                                                     const Conv2dShape& s) {
  const int H = s.H, W = s.W;
  const int64_t P = int64_t(H) * W, ld = nb * P;
  const float* inp_end = inp + nb * s.C * P;
  PaddedPlane pad(H, W);
  for (int c = 0; c < s.C; ++c)
    for (int b = 0; b < nb; ++b) {
      const float* src = inp + (int64_t(b) * s.C + c) * P;
      pad.fill(src, inp_end);
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) {
          float* dst = cols + ((int64_t(c) * 3 + kh) * 3 + kw) * ld + b * P;
          for (int oh = 0; oh < H; ++oh)
            copy_row(dst + oh * W, pad.row(oh + kh) + kw, W, dst + oh * W, dst + P);
        }
    }
}

// Per plane, the nine dcols rows added into a zeroed padded plane (the cells outside the
// plane gather what falls there), then its inside copied out: per inside cell the additions
// in (kh, kw) order, as the general path's. Rows are visited oh-innermost, so a row's store is
// long done when the next (kh, kw) reads it back at a shifted column (a load that overlaps a
// store still in flight at another offset waits for it).
__attribute__((target("avx512f"))) void col2im_avx512(float* dinp, const float* dcols, int nb,
                                                     const Conv2dShape& s) {
  const int H = s.H, W = s.W;
  const int64_t P = int64_t(H) * W, ld = nb * P;
  const float* dend = dcols + 9 * s.C * ld;
  PaddedPlane acc(H, W);
  for (int c = 0; c < s.C; ++c)
    for (int b = 0; b < nb; ++b) {
      std::fill(acc.p, acc.row(H + 2), 0.f);
      for (int kh = 0; kh < 3; ++kh)
        for (int kw = 0; kw < 3; ++kw) {
          const float* src = dcols + ((int64_t(c) * 3 + kh) * 3 + kw) * ld + b * P;
          for (int oh = 0; oh < H; ++oh)
            for (int k = 0; k < W; k += 16) {
              // Lanes past the row add zeros (outside the plane's cells, or +0 to a cell).
              const __mmask16 m = __mmask16(W - k >= 16 ? 0xffff : (1u << (W - k)) - 1);
              const float* sp = src + oh * W + k;
              const __m512 d = sp + 16 <= dend ? _mm512_maskz_mov_ps(m, _mm512_loadu_ps(sp))
                                               : _mm512_maskz_loadu_ps(m, sp);
              float* a = acc.row(oh + kh) + kw + k;
              _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), d));
            }
        }
      float* out = dinp + (int64_t(b) * s.C + c) * P;
      for (int ih = 0; ih < H; ++ih)
        copy_row(out + ih * W, acc.row(ih + 1) + 1, W, out + ih * W, out + P);
    }
}
#endif

}  // namespace

bool same3x3_applies(const Conv2dShape& s) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && s.KH == 3 && s.KW == 3 && s.stride == 1 && s.pad == 1;
#else
  (void)s;
  return false;
#endif
}

#if defined(__x86_64__)
void im2col_same3x3(float* cols, const float* inp, int nb, const Conv2dShape& s) {
  im2col_avx512(cols, inp, nb, s);
}
void col2im_same3x3(float* dinp, const float* dcols, int nb, const Conv2dShape& s) {
  col2im_avx512(dinp, dcols, nb, s);
}
#else  // never called: same3x3_applies is false
void im2col_same3x3(float*, const float*, int, const Conv2dShape&) {}
void col2im_same3x3(float*, const float*, int, const Conv2dShape&) {}
#endif

}  // namespace strata::cpu
