#include "conv_implicit.h"

#include <algorithm>
#include <cstring>

#include "small_gemm.h"

namespace strata::cpu {

int64_t PaddedChunk::padded_floats(const Conv2dShape& s, int nb) {
  return int64_t(nb) * s.C * (s.H + 2 * s.pad) * (s.W + 2 * s.pad);
}

PaddedChunk::PaddedChunk(float* scratch, const float* inp, int nb, const Conv2dShape& s) {
  const int HP = s.H + 2 * s.pad, WP = s.W + 2 * s.pad;
  const int64_t plane = int64_t(HP) * WP;
  std::fill(scratch, scratch + padded_floats(s, nb), 0.f);
  for (int64_t i = 0; i < int64_t(nb) * s.C; ++i)
    for (int h = 0; h < s.H; ++h)
      std::memcpy(scratch + i * plane + int64_t(h + s.pad) * WP + s.pad,
                  inp + (i * s.H + h) * s.W, sizeof(float) * s.W);
  thread_local std::vector<int64_t> ck, pos;
  ck.resize(size_t(ck_of(s)));
  pos.resize(size_t(nb * p_of(s)));
  for (int c = 0, i = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) ck[size_t(i++)] = c * plane + kh * WP + kw;
  const int OH = s.OH(), OW = s.OW();
  for (int b = 0, j = 0; b < nb; ++b)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow)
        pos[size_t(j++)] = b * s.C * plane + int64_t(oh) * s.stride * WP + int64_t(ow) * s.stride;
  padded = scratch, ck_off = ck.data(), pos_off = pos.data();
}

void implicit_weight_t(float* w_t, const float* weight, const Conv2dShape& s) {
  small_transpose(weight, ck_of(s), s.OC, int(ck_of(s)), w_t, s.OC);
}

// out^T (nb*P, OC) = cols^T @ weight^T + bias, each row a position reading its receptive field
// in place, then each sample's (P, OC) block transposed into out.
void implicit_forward(float* out, const PaddedChunk& x, const float* w_t, const float* bias,
                      int nb, const Conv2dShape& s, float* out_t) {
  const int64_t CK = ck_of(s), P = p_of(s), n = nb * P;
  small_gemm_gathered(int(n), s.OC, int(CK), x.padded, x.pos_off, x.ck_off, w_t, s.OC, out_t,
                      s.OC, false, bias);
  for (int b = 0; b < nb; ++b)
    small_transpose(out_t + b * P * s.OC, s.OC, int(P), s.OC, out + b * s.OC * P, P);
}

void implicit_weight_grad_t(float* dweight_t, const PaddedChunk& x, const float* dy_t,
                            int64_t CK, int64_t n, int OC, bool accumulate) {
  small_gemm_gathered(int(CK), OC, int(n), x.padded, x.ck_off, x.pos_off, dy_t, OC, dweight_t,
                      OC, accumulate, nullptr);
}

}  // namespace strata::cpu
