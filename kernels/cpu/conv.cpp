// Conv2d as im2col + sgemm.
//
// Samples are processed in chunks of nb (see chunk_samples). For a chunk, im2col writes
//   cols (CK, nb*P)   CK = C*KH*KW rows (c, kh, kw), nb*P columns (b, oh, ow), P = OH*OW
// and one sgemm per chunk does the work (few taps, CK <= 16, in fp32: conv_few_taps.h):
//   forward   y (OC, nb*P)   = weight (OC, CK) @ cols
//   backward  dweight (OC,CK) += dy (OC, nb*P) @ cols^T
//             dcols (CK, nb*P) = weight^T @ dy,  then col2im scatters dcols into dinp.
// y and dy are (OC, nb*P), while NCHW activations of a chunk are (nb, OC, P): a transposing
// copy converts between them (fused with the bias add in forward). With nb == 1 the two
// layouts coincide and the gemms read and write the activations in place. cols is rebuilt in
// backward rather than kept from forward, so one scratch buffer can serve every layer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "conv_few_taps.h"
#include "conv_implicit.h"
#include "conv_same3x3.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

// Samples per chunk: enough for ~200 gemm columns (nb*P). Per-sample gemms on large images
// keep cols in L2 and need no layout transposition; small late-layer images batch a few
// samples so the gemm is not tiny. Measured at batch 64 (one thread, OpenBLAS SkylakeX, before the switch to oneDNN's sgemm):
// im2col of the whole batch at once was 1.3-2x slower (cols of 8-18 MB stream through memory).
int chunk_samples(const Conv2dShape& s) {
  const int64_t P = std::max<int64_t>(p_of(s), 1);
  return int(std::clamp<int64_t>(200 / P, 1, std::max(s.B, 1)));
}

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

// Zeroes columns [0, rw.lo) and [rw.hi, OW) of rows rh of x (OH, OW): the few (pad-wide)
// columns that read padding. Column by column, so no short memset per row.
void zero_columns(float* x, Range rh, Range rw, int OW) {
  auto zero_column = [&](int ow) {
    for (int oh = rh.lo; oh < rh.hi; ++oh) x[int64_t(oh) * OW + ow] = 0.f;
  };
  for (int ow = 0; ow < rw.lo; ++ow) zero_column(ow);
  for (int ow = rw.hi; ow < OW; ++ow) zero_column(ow);
}

// One cols row for one sample: dst (OH*OW) is the input plane src (H,W) read at
// (oh*stride + kh - pad, ow*stride + kw - pad), zero where that falls in the padding.
void im2col_plane(float* dst, const float* src, int kh, int kw, Range rh, Range rw,
                  const Conv2dShape& s) {
  const int OW = s.OW(), st = s.stride;
  std::fill(dst, dst + int64_t(rh.lo) * OW, 0.f);
  std::fill(dst + int64_t(rh.hi) * OW, dst + p_of(s), 0.f);
  if (st == 1 && OW == s.W) {
    // "Same" convolution: input and output rows have equal length, so all valid rows are one
    // contiguous shifted copy of the plane (one long copy instead of a short one per row);
    // afterwards the columns that wrapped around into the neighbouring row are zeroed.
    const int64_t off = int64_t(kh - s.pad) * s.W + (kw - s.pad);
    const int64_t d_lo = int64_t(rh.lo) * OW, d_hi = int64_t(rh.hi) * OW;
    // Clip to the plane: only wrapped (padding) columns at its first/last element fall outside.
    const int64_t lo = std::max(d_lo, -off);
    const int64_t hi = std::max(lo, std::min(d_hi, int64_t(s.H) * s.W - off));
    std::fill(dst + d_lo, dst + lo, 0.f);
    std::copy(src + lo + off, src + hi + off, dst + lo);
    std::fill(dst + hi, dst + d_hi, 0.f);
    zero_columns(dst, rh, rw, OW);
    return;
  }
  for (int oh = rh.lo; oh < rh.hi; ++oh) {
    float* row = dst + int64_t(oh) * OW;
    // in[ow*st] is input column ow*st + kw - pad of input row oh*st + kh - pad.
    const float* in = src + int64_t(oh * st + kh - s.pad) * s.W + (kw - s.pad);
    std::fill(row, row + rw.lo, 0.f);
    if (st == 1)
      std::copy(in + rw.lo, in + rw.hi, row + rw.lo);
    else
      for (int ow = rw.lo; ow < rw.hi; ++ow) row[ow] = in[ow * st];
    std::fill(row + rw.hi, row + OW, 0.f);
  }
}

// The adjoint of im2col_plane: dinp plane (H,W) += the entries of one dcols row that
// im2col_plane copied from it. dcols is scratch: its padding entries may be zeroed.
void col2im_plane(float* dinp, float* dcols, int kh, int kw, Range rh, Range rw,
                  const Conv2dShape& s) {
  const int OW = s.OW(), st = s.stride;
  if (st == 1 && OW == s.W) {
    // As in im2col_plane: zero the wrapped columns, then one contiguous shifted add.
    zero_columns(dcols, rh, rw, OW);
    const int64_t off = int64_t(kh - s.pad) * s.W + (kw - s.pad);
    const int64_t lo = std::max(int64_t(rh.lo) * OW, -off);
    const int64_t hi = std::min(int64_t(rh.hi) * OW, int64_t(s.H) * s.W - off);
    float* out = dinp + off;
    for (int64_t d = lo; d < hi; ++d) out[d] += dcols[d];
    return;
  }
  for (int oh = rh.lo; oh < rh.hi; ++oh) {
    const float* row = dcols + int64_t(oh) * OW;
    float* out = dinp + int64_t(oh * st + kh - s.pad) * s.W + (kw - s.pad);
    if (st == 1)
      for (int ow = rw.lo; ow < rw.hi; ++ow) out[ow] += row[ow];
    else
      for (int ow = rw.lo; ow < rw.hi; ++ow) out[ow * st] += row[ow];
  }
}

// cols (CK, nb*P) from inp (nb, C, H, W).
void im2col(float* cols, const float* inp, int nb, const Conv2dShape& s) {
  if (same3x3_applies(s)) return im2col_same3x3(cols, inp, nb, s);
  const int64_t P = p_of(s), ld = nb * P, plane = int64_t(s.H) * s.W;
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh) {
      const Range rh = valid_range(kh, s.pad, s.stride, s.H, s.OH());
      for (int kw = 0; kw < s.KW; ++kw) {
        const Range rw = valid_range(kw, s.pad, s.stride, s.W, s.OW());
        float* row = cols + ((int64_t(c) * s.KH + kh) * s.KW + kw) * ld;
        for (int b = 0; b < nb; ++b)
          im2col_plane(row + b * P, inp + (int64_t(b) * s.C + c) * plane, kh, kw, rh, rw, s);
      }
    }
}

// dinp (nb, C, H, W) = col2im(dcols (CK, nb*P)), overwriting dinp.
void col2im(float* dinp, float* dcols, int nb, const Conv2dShape& s) {
  if (same3x3_applies(s)) return col2im_same3x3(dinp, dcols, nb, s);
  const int64_t P = p_of(s), ld = nb * P, plane = int64_t(s.H) * s.W;
  std::fill(dinp, dinp + nb * s.C * plane, 0.f);
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh) {
      const Range rh = valid_range(kh, s.pad, s.stride, s.H, s.OH());
      for (int kw = 0; kw < s.KW; ++kw) {
        const Range rw = valid_range(kw, s.pad, s.stride, s.W, s.OW());
        float* row = dcols + ((int64_t(c) * s.KH + kh) * s.KW + kw) * ld;
        for (int b = 0; b < nb; ++b)
          col2im_plane(dinp + (int64_t(b) * s.C + c) * plane, row + b * P, kh, kw, rh, rw, s);
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

// A chunk's scratch: cols (CK, nb*P), plus y/dy (OC, nb*P) when chunks hold more than one sample.
int64_t chunk_scratch(const Conv2dShape& s) {
  const int64_t nb = chunk_samples(s), n = nb * p_of(s);
  return ck_of(s) * n + (nb > 1 ? int64_t(s.OC) * n : 0);
}

// The parts of conv2d_scratch_size's scratch after the chunk's (see there).
float* wgrad_scratch(float* scratch, const Conv2dShape& s) { return scratch + chunk_scratch(s); }
float* padded_scratch(float* scratch, const Conv2dShape& s) {
  const int64_t n = chunk_samples(s) * p_of(s);
  return wgrad_scratch(scratch, s) + (ck_of(s) + n) * s.OC;
}

// The three GEMMs of a chunk, in fp32 or (train.precision = "bf16") on bf16 copies of their
// inputs: the weight rounded once per call, dy once per chunk for both backward products, the
// columns straight into the layout the matmul's kernels read (matmul_bf16_rounding_b).
// fp32 on AVX-512 (but for few taps) takes small_gemm.h's kernels: the forward and the weight
// gradient read the padded input in place (implicit(), conv_implicit.h), the input gradient's
// product its operands where they are (the transposed weight is a stride). The weight gradient
// is summed transposed, dweight^T (CK, OC) += cols @ dy^T, from a transposed copy of dy (OC x
// n: a fifth of cols on the CNN), and transposed back once per call (weight_grad_done). On the
// CNN's conv2 per sample (bench_gemm, Zen 5), oneDNN's sgemm took a 256-bit kernel for the
// weight gradient and copies for the transposed weight.
class ChunkGemms {
 public:
  // need_weight false: no product reads the weight (backward without dinp), none is rounded.
  ChunkGemms(bool bf16, const float* weight, int64_t weight_size, bool need_weight = true)
      : bf16_(bf16), small_(!bf16 && small_gemm_supported()), w_(weight) {
    if (bf16_ && need_weight) {
      wb_ = bf16_scratch(1, size_t(weight_size));
      to_bf16(wb_, weight, weight_size);
    }
  }
  // The few-taps kernels (conv_few_taps.h) take the fp32 products of this shape.
  bool few_taps(int OC, int64_t CK) const { return !bf16_ && few_taps_applies(OC, CK); }
  // The forward and weight gradient read the padded input in place (conv_implicit.h).
  bool implicit(int OC, int64_t CK) const { return small_ && !few_taps(OC, CK); }
  // y (OC, n) = weight (OC, CK) @ cols (CK, n), added to y when `add`.
  void forward(float* y, const float* cols, int OC, int64_t n, int64_t CK, bool add) const {
    if (few_taps(OC, CK)) return few_taps_forward(y, w_, cols, OC, n, CK, nullptr, add);
    if (!bf16_)
      return sgemm(false, false, OC, int(n), int(CK), 1.f, w_, int(CK), cols, int(n),
                   add ? 1.f : 0.f, y, int(n));
    matmul_bf16_rounding_b(false, false, OC, int(n), int(CK), wb_, int(CK), cols, int(n), y,
                           int(n), nullptr, false, add);
  }
  // Backward's gradient at the chunk's output, dy (OC, n), for the next two products.
  void set_dy(const float* dy, int OC, int64_t n) {
    dy_ = dy;
    if (bf16_) dyb_ = to_bf16_scratch(2, dy, OC * n);
  }
  // y (OC, n) = bias + weight @ cols (no bias: 0).
  void forward_biased(float* y, const float* cols, int OC, int64_t n, int64_t CK,
                      const float* bias) const {
    if (few_taps(OC, CK)) return few_taps_forward(y, w_, cols, OC, n, CK, bias, false);
    if (bias)
      for (int oc = 0; oc < OC; ++oc) std::fill(y + oc * n, y + (oc + 1) * n, bias[oc]);
    forward(y, cols, OC, n, CK, bias != nullptr);
  }
  // dweight (OC, CK) = dy @ cols^T, added to dweight when `add`; dbias (few taps only) as
  // few_taps_weight_grad sums it.
  void weight_grad(float* dweight, const float* cols, int OC, int64_t n, int64_t CK, bool add,
                   float* dbias) const {
    if (few_taps(OC, CK)) return few_taps_weight_grad(dweight, dbias, dy_, cols, OC, n, CK, add);
    if (!bf16_)
      return sgemm(false, true, OC, int(CK), int(n), 1.f, dy_, int(n), cols, int(n),
                   add ? 1.f : 0.f, dweight, int(CK));
    matmul_bf16_rounding_b(false, true, OC, int(CK), int(n), dyb_, int(n), cols, int(n),
                           dweight, int(CK), nullptr, false, add);
  }
  // The same on the implicit path: the sums go to `transposed` (CK x OC) and to dweight at
  // weight_grad_done; `spare` holds dy^T (n x OC).
  void weight_grad(float* dweight, const PaddedChunk& x, int OC, int64_t n, int64_t CK, bool add,
                   float* transposed, float* spare) {
    if (add && !transposed_) small_transpose(dweight, CK, OC, int(CK), transposed, OC);
    transposed_ = transposed;
    small_transpose(dy_, n, OC, int(n), spare, OC);
    implicit_weight_grad_t(transposed, x, spare, CK, n, OC, add);
  }
  // After the last chunk's weight_grad: dweight from its transposed sums, if they were kept so.
  void weight_grad_done(float* dweight, int OC, int64_t CK) const {
    if (transposed_) small_transpose(transposed_, OC, int(CK), OC, dweight, CK);
  }
  // dcols (CK, n) = weight^T @ dy.
  void input_grad(float* dcols, int OC, int64_t n, int64_t CK) const {
    if (small_) return small_gemm(int(CK), int(n), OC, w_, 1, CK, dy_, n, dcols, n, false);
    if (!bf16_)
      return sgemm(true, false, int(CK), int(n), OC, 1.f, w_, int(CK), dy_, int(n), 0.f, dcols,
                   int(n));
    matmul_bf16(true, false, int(CK), int(n), OC, wb_, int(CK), dyb_, int(n), dcols, int(n),
                nullptr, false, false);
  }

 private:
  bool bf16_, small_;
  const float* w_;
  float* transposed_ = nullptr;  // dweight^T's sums, from the first weight_grad on
  bf16_t* wb_ = nullptr;
  const float* dy_ = nullptr;
  const bf16_t* dyb_ = nullptr;
};

// inp (B,C,H,W), weight (OC,C,KH,KW), bias (OC) -> out (B,OC,OH,OW)
void forward(float* out, const float* inp, const float* weight, const float* bias,
             const Conv2dShape& s, float* scratch, bool bf16) {
  const int64_t CK = ck_of(s), P = p_of(s), in_sample = int64_t(s.C) * s.H * s.W;
  const int nb_max = chunk_samples(s);
  const ChunkGemms gemms(bf16, weight, s.OC * CK);
  const bool implicit = gemms.implicit(s.OC, CK);
  float* cols = scratch;
  float* w_t = wgrad_scratch(scratch, s);  // the implicit path's weight^T, then out^T
  if (implicit) implicit_weight_t(w_t, weight, s);
  for (int b0 = 0; b0 < s.B; b0 += nb_max) {
    const int nb = std::min(nb_max, s.B - b0);
    const int64_t n = nb * P;
    float* out0 = out + int64_t(b0) * s.OC * P;
    if (implicit) {
      const PaddedChunk x(padded_scratch(scratch, s), inp + b0 * in_sample, nb, s);
      implicit_forward(out0, x, w_t, bias, nb, s, w_t + CK * s.OC);
      continue;
    }
    im2col(cols, inp + b0 * in_sample, nb, s);
    if (nb_max == 1) {  // out_b (OC, P) is the gemm's own layout
      gemms.forward_biased(out0, cols, s.OC, n, CK, bias);
      continue;
    }
    float* y = cols + CK * n;
    gemms.forward(y, cols, s.OC, n, CK, false);
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
void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
              const float* weight, const Conv2dShape& s, float* scratch, bool accumulate,
              bool bf16) {
  const int64_t CK = ck_of(s), P = p_of(s), in_sample = int64_t(s.C) * s.H * s.W;
  const int nb_max = chunk_samples(s);
  ChunkGemms gemms(bf16, weight, s.OC * CK, dinp != nullptr);  // dinp's product reads it
  const bool implicit = gemms.implicit(s.OC, CK);
  float* cols = scratch;
  float* wgrad = wgrad_scratch(scratch, s);  // weight_grad's: dweight^T (CK, OC), then dy^T
  if (dbias && !accumulate) std::fill(dbias, dbias + s.OC, 0.f);
  if (dweight && s.B == 0 && !accumulate) std::fill(dweight, dweight + s.OC * CK, 0.f);
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
    // One sample per chunk: the few-taps gradient sums the bias's rows as it reads dy.
    const bool bias_in_grad = dbias && dweight && nb_max == 1 && gemms.few_taps(s.OC, CK);
    if (dbias && !bias_in_grad)
      for (int b = 0; b < nb; ++b)
        for (int oc = 0; oc < s.OC; ++oc)
          dbias[oc] += sum_floats(dout0 + (int64_t(b) * s.OC + oc) * P, P);
    gemms.set_dy(dy, s.OC, n);
    if (dweight && implicit) {
      const PaddedChunk x(padded_scratch(scratch, s), inp + b0 * in_sample, nb, s);
      gemms.weight_grad(dweight, x, s.OC, n, CK, b0 > 0 || accumulate, wgrad, wgrad + CK * s.OC);
    } else if (dweight) {
      im2col(cols, inp + b0 * in_sample, nb, s);
      gemms.weight_grad(dweight, cols, s.OC, n, CK, b0 > 0 || accumulate,
                        bias_in_grad ? dbias : nullptr);
    }
    if (dinp) {
      gemms.input_grad(cols, s.OC, n, CK);
      col2im(dinp + b0 * in_sample, cols, nb, s);
    }
  }
  if (dweight) gemms.weight_grad_done(dweight, s.OC, CK);
}

}  // namespace

// Scratch: cols (CK, nb*P), plus y/dy (OC, nb*P) when chunks hold more than one sample (the
// chunk's); then ChunkGemms::weight_grad's dweight^T (CK, OC) and dy^T (nb*P, OC), which
// implicit_forward uses for the weight^T and out^T of the same sizes; then the implicit path's
// padded chunk.
int64_t conv2d_scratch_size(const Conv2dShape& s) {
  const int64_t n = chunk_samples(s) * p_of(s);
  return chunk_scratch(s) + (ck_of(s) + n) * s.OC + PaddedChunk::padded_floats(s, chunk_samples(s));
}

// The entry points in one precision (BF16: false, or true for bf16 copies of the GEMM
// operands), written once and expanded for each.
#define STRATA_CONV2D_ENTRY_POINTS(BF16)                                                       \
  void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,  \
                      const Conv2dShape& s, float* scratch) {                                \
    forward(out, inp, weight, bias, s, scratch, BF16);                                       \
  }                                                                                          \
  void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,         \
                       const float* inp, const float* weight, const Conv2dShape& s,          \
                       float* scratch, bool accumulate) {                                    \
    backward(dinp, dweight, dbias, dout, inp, weight, s, scratch, accumulate, BF16);         \
  }

STRATA_CONV2D_ENTRY_POINTS(false)

namespace bf16 {
STRATA_CONV2D_ENTRY_POINTS(true)
}  // namespace bf16

#undef STRATA_CONV2D_ENTRY_POINTS

// int8 inference: per chunk, y (OC, n) = w.q (OC, CK) @ cq (CK, n), cq the chunk's columns
// quantized per output position (each column of cols its own scale; s8, so no transposition),
// summed in int32 by oneDNN, then scaled back with the bias (into NCHW, as forward does).
void conv2d_int8_forward(float* out, const float* inp, const Int8Matrix& w, const float* bias,
                         const Conv2dShape& s, float* scratch) {
  const int64_t CK = ck_of(s), P = p_of(s), in_sample = int64_t(s.C) * s.H * s.W;
  const int nb_max = chunk_samples(s);
  const int64_t n_max = nb_max * P;
  thread_local std::vector<int8_t> cq;
  thread_local std::vector<float> scale, inv;
  thread_local std::vector<int32_t> acc;
  cq.resize(size_t(n_max * CK));
  scale.resize(size_t(n_max));
  inv.resize(size_t(n_max));
  acc.resize(size_t(n_max * s.OC));
  float* cols = scratch;
  for (int b0 = 0; b0 < s.B; b0 += nb_max) {
    const int nb = std::min(nb_max, s.B - b0);
    const int64_t n = nb * P;
    im2col(cols, inp + b0 * in_sample, nb, s);
    std::fill(scale.begin(), scale.begin() + n, 0.f);
    if (w.act_scale <= 0)
      for (int64_t k = 0; k < CK; ++k)
        for (int64_t j = 0; j < n; ++j) scale[j] = std::max(scale[j], std::abs(cols[k * n + j]));
    for (int64_t j = 0; j < n; ++j) {
      scale[j] = w.act_scale > 0 ? w.act_scale : scale[j] > 0 ? scale[j] / 127.f : 1.f;
      inv[j] = 1.f / scale[j];
    }
    for (int64_t k = 0; k < CK; ++k)
      quantize_scaled(cq.data() + k * n, cols + k * n, inv.data(), n);
    matmul_s8s8(s.OC, int(n), int(CK), w.q, int(CK), cq.data(), int(n), acc.data(), int(n));
    for (int b = 0; b < nb; ++b)
      for (int oc = 0; oc < s.OC; ++oc) {
        float* y = out + (int64_t(b0 + b) * s.OC + oc) * P;
        const int32_t* a = acc.data() + oc * n + b * P;
        const float ws = w.scale[oc], bv = bias ? bias[oc] : 0.f;
        const float* sc = scale.data() + b * P;
        for (int64_t p = 0; p < P; ++p) y[p] = float(a[p]) * (sc[p] * ws) + bv;
      }
  }
}

}  // namespace strata::cpu
