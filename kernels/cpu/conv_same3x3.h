// im2col and col2im (conv.cpp) for 3x3 "same" convolutions, stride 1 and padding 1 (output
// planes the input's size: the CNN's), on AVX-512. Each cols row of a sample is its input
// plane shifted by (kh - 1, kw - 1), zero where that leaves the plane: here whole-vector
// copies from a zero-padded copy of the plane, and col2im's sums gathered in one, with no
// library calls or per-row bookkeeping, where conv.cpp's general path spent its time (9 % of
// the CNN's step on Zen 5). The same copies and the same additions in the same order: bitwise
// the general path's results (tests/ops/conv_pool.cpp).
#pragma once
#include "strata/ops.h"

namespace strata::cpu {

// Whether this shape takes the functions below on this CPU.
bool same3x3_applies(const Conv2dShape& s);
// cols (9C, nb*P) from inp (nb, C, H, W); P = H*W.
void im2col_same3x3(float* cols, const float* inp, int nb, const Conv2dShape& s);
// dinp (nb, C, H, W) = col2im(dcols (9C, nb*P)), overwriting dinp.
void col2im_same3x3(float* dinp, const float* dcols, int nb, const Conv2dShape& s);

}  // namespace strata::cpu
