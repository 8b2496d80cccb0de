// Convolutions' forward and weight gradient in fp32 on AVX-512 with no im2col matrix: the GEMMs
// read each chunk's zero-padded input in place (small_gemm_gathered), element (ck, j) of the
// im2col matrix cols (CK, nb*P) at padded[ck_off[ck] + pos_off[j]]. im2col wrote 9 floats per
// input float for 3x3 kernels and the GEMMs read them back (8.2 % of the CNN's step on Zen 5,
// twice per sample: forward and weight gradient); the padded copy is one. The same products
// in the same order as the im2col GEMMs: bitwise their results (tests/bitwise_vs_build.py
// against the build before, identical; tests/ops/conv_pool.cpp checks strided and padded
// shapes against direct convolution).
#pragma once
#include <cstdint>
#include <vector>

#include "strata/ops.h"

namespace strata::cpu {

// A convolution's im2col dimensions: rows C*KH*KW, columns per sample OH*OW.
inline int64_t ck_of(const Conv2dShape& s) { return int64_t(s.C) * s.KH * s.KW; }
inline int64_t p_of(const Conv2dShape& s) { return int64_t(s.OH()) * s.OW(); }

// A chunk's input (nb samples), zero-padded by s.pad on every side, and the offsets that read
// it as cols (CK, nb*P).
struct PaddedChunk {
  const float* padded = nullptr;
  const int64_t* ck_off = nullptr;   // CK: (c, kh, kw) -> c*HP*WP + kh*WP + kw
  const int64_t* pos_off = nullptr;  // nb*P: (b, oh, ow) -> b*C*HP*WP + oh*stride*WP + ow*stride
  // Writes the padded copy to `scratch` (padded_floats(s, nb) floats) and the offsets to
  // per-thread tables (one chunk's at a time: the next PaddedChunk on the thread rewrites them).
  PaddedChunk(float* scratch, const float* inp, int nb, const Conv2dShape& s);
  static int64_t padded_floats(const Conv2dShape& s, int nb);
};

// w_t (CK, OC) = weight (OC, CK)^T, once per call for all its chunks.
void implicit_weight_t(float* w_t, const float* weight, const Conv2dShape& s);
// out (nb, OC, OH, OW) = weight @ cols + bias, from w_t; out_t: nb*P*OC floats of scratch.
void implicit_forward(float* out, const PaddedChunk& x, const float* w_t, const float* bias,
                      int nb, const Conv2dShape& s, float* out_t);

// dweight^T (CK, OC) [+]= cols @ dy^T (n = nb*P, OC), added when accumulate.
void implicit_weight_grad_t(float* dweight_t, const PaddedChunk& x, const float* dy_t,
                            int64_t CK, int64_t n, int OC, bool accumulate);

}  // namespace strata::cpu
