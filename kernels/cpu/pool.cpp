// Max pooling without padding. Forward records where each max came from, so backward is a
// scatter and never re-reads the input.
#include <algorithm>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

// inp (B,C,H,W) -> out (B,C,OH,OW), argmax (B,C,OH,OW) = index in the (H,W) plane.
// Ties keep the first element in row-major window order; a NaN wins (as in PyTorch).
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int B, int C, int H, int W,
                       int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* x = inp + pl * H * W;
    float* y = out + pl * OH * OW;
    int32_t* am = argmax + pl * OH * OW;
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        int best_i = oh * st * W + ow * st;
        float best = x[best_i];
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            const int idx = (oh * st + i) * W + ow * st + j;
            const float v = x[idx];
            if (v > best || v != v) {
              best = v;
              best_i = idx;
            }
          }
        y[oh * OW + ow] = best;
        am[oh * OW + ow] = best_i;
      }
  }
}

// dout (B,C,OH,OW), argmax (B,C,OH,OW) -> dinp (B,C,H,W). Overlapping windows (st < k) add up.
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int B, int C,
                        int H, int W, int k, int st) {
  const int OH = (H - k) / st + 1, OW = (W - k) / st + 1;
  const int64_t planes = int64_t(B) * C, n_out = int64_t(OH) * OW;
  std::fill(dinp, dinp + planes * H * W, 0.f);
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dx = dinp + pl * H * W;
    const float* dy = dout + pl * n_out;
    const int32_t* am = argmax + pl * n_out;
    for (int64_t i = 0; i < n_out; ++i) dx[am[i]] += dy[i];
  }
}

}  // namespace strata::cpu
