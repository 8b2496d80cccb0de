// Conv2d as im2col + sgemm.
//
// Samples are processed in chunks of nb (see chunk_samples). For a chunk, im2col writes
//   cols (CK, nb*P)   CK = C*KH*KW rows (c, kh, kw), nb*P columns (b, oh, ow), P = OH*OW
// and one sgemm per chunk does the work:
//   forward   y (OC, nb*P)   = weight (OC, CK) @ cols
//   backward  dweight (OC,CK) += dy (OC, nb*P) @ cols^T
//             dcols (CK, nb*P) = weight^T @ dy,  then col2im scatters dcols into dinp.
// y and dy are (OC, nb*P), while NCHW activations of a chunk are (nb, OC, P): a transposing
// copy converts between them (fused with the bias add / bias gradient). With nb == 1 the two
// layouts coincide and the gemm reads and writes the activations in place.
#include <algorithm>
#include <cstring>

#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

int64_t ck_of(const Conv2dShape& s) { return int64_t(s.C) * s.KH * s.KW; }
int64_t p_of(const Conv2dShape& s) { return int64_t(s.OH()) * s.OW(); }

// Samples per chunk.
int chunk_samples(const Conv2dShape& s) { return std::max(s.B, 1); }

// Output positions o in [lo, hi) whose input index o*stride + k - pad lies in [0, n): the rest
// read padding. Computed once per kernel offset so the copy loops have no bounds checks.
struct Range {
  int lo, hi;
};
Range valid_range(int k, int pad, int stride, int n, int out_n) {
  int lo = 0;
  if (pad > k) lo = (pad - k + stride - 1) / stride;
  int last = n - 1 + pad - k;  // o*stride <= last
  int hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out_n);
  hi = std::clamp(hi, lo, out_n);
  return {lo, hi};
}

// cols (CK, nb*P) from inp (nb, C, H, W).
void im2col(float* cols, const float* inp, int nb, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW(), st = s.stride;
  const int64_t P = p_of(s), ld = nb * P, plane = int64_t(s.H) * s.W;
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh) {
      const Range rh = valid_range(kh, s.pad, st, s.H, OH);
      for (int kw = 0; kw < s.KW; ++kw) {
        const Range rw = valid_range(kw, s.pad, st, s.W, OW);
        float* row = cols + ((int64_t(c) * s.KH + kh) * s.KW + kw) * ld;
        for (int b = 0; b < nb; ++b) {
          float* dst_b = row + b * P;
          const float* src_plane = inp + (int64_t(b) * s.C + c) * plane;
          std::fill(dst_b, dst_b + int64_t(rh.lo) * OW, 0.f);
          for (int oh = rh.lo; oh < rh.hi; ++oh) {
            float* dst = dst_b + int64_t(oh) * OW;
            // src[ow*st] is input column ow*st + kw - pad of input row oh*st + kh - pad.
            const float* src = src_plane + int64_t(oh * st + kh - s.pad) * s.W + (kw - s.pad);
            std::fill(dst, dst + rw.lo, 0.f);
            if (st == 1)
              std::memcpy(dst + rw.lo, src + rw.lo, sizeof(float) * (rw.hi - rw.lo));
            else
              for (int ow = rw.lo; ow < rw.hi; ++ow) dst[ow] = src[ow * st];
            std::fill(dst + rw.hi, dst + OW, 0.f);
          }
          std::fill(dst_b + int64_t(rh.hi) * OW, dst_b + P, 0.f);
        }
      }
    }
}

// dinp (nb, C, H, W) = sum of the dcols (CK, nb*P) entries that im2col copied from each input
// element. Overwrites dinp.
void col2im(float* dinp, const float* dcols, int nb, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW(), st = s.stride;
  const int64_t P = p_of(s), ld = nb * P, plane = int64_t(s.H) * s.W;
  std::fill(dinp, dinp + nb * s.C * plane, 0.f);
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh) {
      const Range rh = valid_range(kh, s.pad, st, s.H, OH);
      for (int kw = 0; kw < s.KW; ++kw) {
        const Range rw = valid_range(kw, s.pad, st, s.W, OW);
        const float* row = dcols + ((int64_t(c) * s.KH + kh) * s.KW + kw) * ld;
        for (int b = 0; b < nb; ++b) {
          float* dst_plane = dinp + (int64_t(b) * s.C + c) * plane;
          for (int oh = rh.lo; oh < rh.hi; ++oh) {
            const float* src = row + b * P + int64_t(oh) * OW;
            float* dst = dst_plane + int64_t(oh * st + kh - s.pad) * s.W + (kw - s.pad);
            if (st == 1)
              for (int ow = rw.lo; ow < rw.hi; ++ow) dst[ow] += src[ow];
            else
              for (int ow = rw.lo; ow < rw.hi; ++ow) dst[ow * st] += src[ow];
          }
        }
      }
    }
}

// Sum of n floats with 16 independent partial sums: vectorises without -ffast-math (a single
// accumulator is a serial dependency chain) and is more accurate than one running sum.
float sum_floats(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l];
  for (; i < n; ++i) acc[i % 16] += x[i];
  float total = 0.f;
  for (float a : acc) total += a;
  return total;
}

}  // namespace

// Scratch: cols (CK, nb*P), plus y/dy (OC, nb*P) when chunks hold more than one sample.
int64_t conv2d_scratch_size(const Conv2dShape& s) {
  const int64_t nb = chunk_samples(s), n = nb * p_of(s);
  return ck_of(s) * n + (nb > 1 ? int64_t(s.OC) * n : 0);
}

// inp (B,C,H,W), weight (OC,C,KH,KW), bias (OC) -> out (B,OC,OH,OW)
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, float* scratch) {
  const int64_t CK = ck_of(s), P = p_of(s), in_sample = int64_t(s.C) * s.H * s.W;
  const int nb_max = chunk_samples(s);
  float* cols = scratch;
  for (int b0 = 0; b0 < s.B; b0 += nb_max) {
    const int nb = std::min(nb_max, s.B - b0);
    const int64_t n = nb * P;
    float* out0 = out + int64_t(b0) * s.OC * P;
    im2col(cols, inp + b0 * in_sample, nb, s);
    if (nb_max == 1) {
      // out_b (OC, P) is the gemm's own layout: bias first, then accumulate (beta = 1).
      if (bias)
        for (int oc = 0; oc < s.OC; ++oc) std::fill(out0 + oc * P, out0 + (oc + 1) * P, bias[oc]);
      sgemm(false, false, s.OC, n, CK, 1.f, weight, CK, cols, n, bias ? 1.f : 0.f, out0, n);
      continue;
    }
    float* y = cols + CK * n;
    sgemm(false, false, s.OC, n, CK, 1.f, weight, CK, cols, n, 0.f, y, n);
    // y (OC, nb, P) -> out (nb, OC, P), adding the bias on the way.
    for (int oc = 0; oc < s.OC; ++oc) {
      const float bv = bias ? bias[oc] : 0.f;
      for (int b = 0; b < nb; ++b) {
        const float* src = y + oc * n + b * P;
        float* dst = out0 + (int64_t(b) * s.OC + oc) * P;
        for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + bv;
      }
    }
  }
}

// dout (B,OC,OH,OW), inp (B,C,H,W), weight (OC,C,KH,KW)
//   -> dinp (B,C,H,W), dweight (OC,C,KH,KW), dbias (OC)
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, float* scratch) {
  const int64_t CK = ck_of(s), P = p_of(s), in_sample = int64_t(s.C) * s.H * s.W;
  const int nb_max = chunk_samples(s);
  float* cols = scratch;
  if (dbias) std::fill(dbias, dbias + s.OC, 0.f);
  if (dweight && s.B == 0) std::fill(dweight, dweight + s.OC * CK, 0.f);
  for (int b0 = 0; b0 < s.B; b0 += nb_max) {
    const int nb = std::min(nb_max, s.B - b0);
    const int64_t n = nb * P;
    const float* dout0 = dout + int64_t(b0) * s.OC * P;
    // dy (OC, nb*P): dout itself when nb == 1, else a transposed copy.
    const float* dy = dout0;
    if (nb_max > 1) {
      float* t = cols + CK * n;
      for (int oc = 0; oc < s.OC; ++oc)
        for (int b = 0; b < nb; ++b) {
          const float* src = dout0 + (int64_t(b) * s.OC + oc) * P;
          std::memcpy(t + oc * n + b * P, src, sizeof(float) * P);
        }
      dy = t;
    }
    if (dbias)
      for (int b = 0; b < nb; ++b)
        for (int oc = 0; oc < s.OC; ++oc)
          dbias[oc] += sum_floats(dout0 + (int64_t(b) * s.OC + oc) * P, P);
    if (dweight) {
      // cols is not kept from forward (scratch may be shared between layers): recompute.
      im2col(cols, inp + b0 * in_sample, nb, s);
      sgemm(false, true, s.OC, CK, n, 1.f, dy, n, cols, n, b0 == 0 ? 0.f : 1.f, dweight, CK);
    }
    if (dinp) {
      sgemm(true, false, CK, n, s.OC, 1.f, weight, CK, dy, n, 0.f, cols, n);
      col2im(dinp + b0 * in_sample, cols, nb, s);
    }
  }
}

}  // namespace strata::cpu
