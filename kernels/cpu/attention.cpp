// Causal multi-head self-attention on GPT-2's packed qkv (B,T,3C), forward and backward.
//
// Each (batch, head) pair is one independent problem, run start to end by one OpenMP thread, so
// results are bitwise the same for any thread count. Its products are oneDNN sgemms straight
// on the packed layout (a head's q, k or v is a (T,hs) matrix with row stride 3C; its slice of
// out is a (T,hs) matrix with row stride C): no copies in or out. Inside an OpenMP region
// oneDNN runs each sgemm (and matmul primitive) on the calling thread.
//
// Causality is used, not masked: rows are taken in blocks of kBlock queries, and a block's
// products run only over the keys it may see (columns 0..i1 for rows i0..i1), so the products
// do ~(T + kBlock) / 2T of the full square (62% at T = 256). Softmax works on the rows in
// place right after the block's score product, while they are in cache.
//
// bf16 (train.precision = "bf16", the `bf16` namespace at the end): the same blocks, each
// product on bf16 copies of its inputs through oneDNN's bf16 matmul (fp32 accumulation and
// output); measured 1.47-1.72x the fp32 kernels at T = 256, hs = 64 (the [.bench] test).
//
// The row kernels (softmax forward and backward) are written once over GCC vector types of W
// floats and compiled three times, picked at run time (like optimizer.cpp): for AVX-512 with
// W = 16, AVX2 with W = 8 and baseline x86-64 with W = 4 (each the native width: GCC keeps a
// wider vector type in memory, which measured slower than SSE). Softmax's exp is a polynomial
// on W lanes, where std::exp would be a scalar libm call per score (without -ffast-math GCC
// does not vectorise it). Row sums run in W lanes, so the last bits of a result depend on the
// machine's vector width (never on the thread count).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dispatch.h"
#include "lanes.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

using simd::Lanes;

// Query rows per block. 64 measured best at T = 256, hs = 64 (32: more, smaller sgemms; 128
// and unblocked: more masked work), see the [.bench] test in tests/unit/test_gpt_kernels.cpp;
// for the bf16 products too (forward + backward 14.0 ms against 14.4 at 32 and 15.0 at 128).
constexpr int kBlock = 64;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Causal softmax of one row of scores, in place: row[0..L) <- softmax(scale * row[0..L)),
// then row[L..Z) <- 0 (the masked keys). The row buffer holds Z >= L floats. (fp32 passes
// scale 1, exact, having scaled in its sgemm; bf16 scales here, its products having none.)
template <int W>
STRATA_INLINE void softmax_row_forward(float* row, int L, int Z, float scale) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int full = L / W * W, n = L - full, room = Z - full;
  F m = V::splat(kNegInf);
  for (int j = 0; j < full; j += W) m = V::max(m, V::load(row + j) * scale);
  if (n) m = V::max(m, V::load_tail(row + full, n, room, kNegInf) * scale);
  const float mx = V::hmax(m);
  F sum{};
  for (int j = 0; j < full; j += W) {
    const F e = V::exp_nonpos(V::load(row + j) * scale - mx);
    V::store(row + j, e);
    sum += e;
  }
  F tail{};
  if (n) {  // exp(-inf) = 0
    tail = V::exp_nonpos(V::load_tail(row + full, n, room, kNegInf) * scale - mx);
    sum += tail;
  }
  const float inv = 1.f / V::hsum(sum);
  for (int j = 0; j < full; j += W) V::store(row + j, V::load(row + j) * inv);
  int done = full;
  if (n) {
    V::store_tail(row + full, tail * inv, n, room);  // lanes from L on: 0
    done = room >= W ? full + W : L;
  }
  if (done < Z) std::fill(row + done, row + Z, 0.f);
}

// Softmax backward of one row: with p = att[0..L) and g = dP[0..L),
// dS = p * (g - sum(p * g)), written over g; then dS[L..Z) <- 0. Both rows hold cap >= Z
// floats (g's past Z may be overwritten; lanes past L are masked, not assumed zero).
template <int W>
STRATA_INLINE void softmax_row_backward(float* g, const float* p, int L, int Z, int cap) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int full = L / W * W, n = L - full, room = cap - full;
  F dot{};
  for (int j = 0; j < full; j += W) dot += V::load(p + j) * V::load(g + j);
  F pt{}, gt{};
  if (n) {
    pt = V::load_tail(p + full, n, room, 0.f);
    gt = V::load_tail(g + full, n, room, 0.f);
    dot += pt * gt;
  }
  const float d = V::hsum(dot);
  for (int j = 0; j < full; j += W) V::store(g + j, V::load(p + j) * (V::load(g + j) - d));
  int done = full;
  if (n) {
    V::store_tail(g + full, pt * (gt - d), n, room);  // lanes from L on: 0 * (0 - d) = 0
    done = room >= W ? full + W : L;
  }
  if (done < Z) std::fill(g + done, g + Z, 0.f);
}

// One (batch, head). q, k, v: (T,hs) with row stride 3C (head columns of the packed qkv);
// out: (T,hs) with row stride C; att: (T,T).
template <int W>
STRATA_INLINE void forward_head(float* out, float* att, const float* qkv, int T, int C, int hs) {
  const int ld = 3 * C;
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * C;
  const float scale = 1.f / std::sqrt(float(hs));
  for (int i0 = 0; i0 < T; i0 += kBlock) {
    const int i1 = std::min(T, i0 + kBlock), m = i1 - i0;
    float* s = att + int64_t(i0) * T;
    // S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T
    sgemm(false, true, m, i1, hs, scale, q + int64_t(i0) * ld, ld, k, ld, 0.f, s, T);
    for (int t = i0; t < i1; ++t) softmax_row_forward<W>(att + int64_t(t) * T, t + 1, T, 1.f);
    // out[i0:i1] = P[i0:i1, 0:i1] V[0:i1]  (P is zero above the diagonal)
    sgemm(false, false, m, hs, i1, 1.f, s, T, v, ld, 0.f, out + int64_t(i0) * C, C);
  }
}

// One (batch, head), gradients in the layouts of forward_head. Row blocks run last to first:
// the last block's dK and dV products cover all T key rows and write them (beta 0); earlier
// blocks, which see keys 0..i1 only, add to them (beta 1). dp: kBlock x T scratch.
template <int W>
STRATA_INLINE void backward_head(float* dqkv, float* dp, const float* dout, const float* qkv,
                                 const float* att, int T, int C, int hs) {
  const int ld = 3 * C;
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * C;
  float* dq = dqkv;
  float* dk = dqkv + C;
  float* dv = dqkv + 2 * C;
  const float scale = 1.f / std::sqrt(float(hs));
  const int nblocks = (T + kBlock - 1) / kBlock;
  for (int bi = nblocks - 1; bi >= 0; --bi) {
    const int i0 = bi * kBlock, i1 = std::min(T, i0 + kBlock), m = i1 - i0;
    const float beta = bi == nblocks - 1 ? 0.f : 1.f;
    const float* p = att + int64_t(i0) * T;
    const float* dO = dout + int64_t(i0) * C;
    // dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T
    sgemm(false, true, m, i1, hs, 1.f, dO, C, v, ld, 0.f, dp, T);
    // dV[0:i1] (+)= P[i0:i1, 0:i1]^T dO[i0:i1]
    sgemm(true, false, i1, hs, m, 1.f, p, T, dO, C, beta, dv, ld);
    for (int t = i0; t < i1; ++t)
      softmax_row_backward<W>(dp + int64_t(t - i0) * T, att + int64_t(t) * T, t + 1, i1, T);
    // dQ[i0:i1] = scale * dS[i0:i1, 0:i1] K[0:i1];  dK[0:i1] (+)= scale * dS^T Q[i0:i1]
    sgemm(false, false, m, hs, i1, scale, dp, T, k, ld, 0.f, dq + int64_t(i0) * ld, ld);
    sgemm(true, false, i1, hs, m, scale, dp, T, q + int64_t(i0) * ld, ld, beta, dk, ld);
  }
}

// bf16 (train.precision = "bf16"): the same blocks with each product on bf16 copies of its
// inputs (oneDNN's bf16 matmul, fp32 accumulation and output), as PyTorch's CPU autocast runs
// attention's matmuls; scores, softmax, att and every gradient stay fp32. qkv (and dout) are
// rounded whole, once per call, before the heads start (one streaming pass; rounding each
// head's 64-float rows one call at a time, the rounding's share of the bf16 attention's time
// was 22 % in perf, now 15 %, the rest rounding P and dS), and each head's products read them
// in place, as the fp32 ones read qkv. The scale is applied in the softmax (forward) and when
// rounding dS (backward), so no product needs an alpha. p: the thread's (kBlock,T) bf16 block
// of att, then of scale * dS.
template <int W>
STRATA_INLINE void forward_head_bf16(float* out, float* att, const bf16_t* qkv, int T, int C,
                                     int hs) {
  const int ld = 3 * C;
  const bf16_t* q = qkv;
  const bf16_t* k = qkv + C;
  const bf16_t* v = qkv + 2 * C;
  bf16_t* p = bf16_scratch(0, size_t(kBlock) * size_t(T));
  const float scale = 1.f / std::sqrt(float(hs));
  for (int i0 = 0; i0 < T; i0 += kBlock) {
    const int i1 = std::min(T, i0 + kBlock), m = i1 - i0;
    float* s = att + int64_t(i0) * T;
    // S[i0:i1, 0:i1] = Q[i0:i1] K[0:i1]^T;  P = softmax(scale * S);  out[i0:i1] = P V[0:i1]
    matmul_bf16(false, true, m, i1, hs, q + int64_t(i0) * ld, ld, k, ld, s, T, nullptr, false,
                false);
    for (int t = i0; t < i1; ++t) softmax_row_forward<W>(att + int64_t(t) * T, t + 1, T, scale);
    to_bf16_rows(p, T, s, T, m, i1, 1.f);
    matmul_bf16(false, false, m, hs, i1, p, T, v, ld, out + int64_t(i0) * C, C, nullptr, false,
                false);
  }
}

// As backward_head: blocks last to first, the last writing dK and dV, earlier ones adding.
// g: the head's dout rounded, row stride C.
template <int W>
STRATA_INLINE void backward_head_bf16(float* dqkv, float* dp, const bf16_t* g, const bf16_t* qkv,
                                      const float* att, int T, int C, int hs) {
  const int ld = 3 * C;
  float* dq = dqkv;
  float* dk = dqkv + C;
  float* dv = dqkv + 2 * C;
  const bf16_t* q = qkv;
  const bf16_t* k = qkv + C;
  const bf16_t* v = qkv + 2 * C;
  bf16_t* p = bf16_scratch(0, size_t(kBlock) * size_t(T));
  const float scale = 1.f / std::sqrt(float(hs));
  const int nblocks = (T + kBlock - 1) / kBlock;
  for (int bi = nblocks - 1; bi >= 0; --bi) {
    const int i0 = bi * kBlock, i1 = std::min(T, i0 + kBlock), m = i1 - i0;
    const bool add = bi != nblocks - 1;
    const bf16_t* gi = g + int64_t(i0) * C;
    // dP = dO[i0:i1] V[0:i1]^T;  dV[0:i1] (+)= P[i0:i1, 0:i1]^T dO[i0:i1]
    matmul_bf16(false, true, m, i1, hs, gi, C, v, ld, dp, T, nullptr, false, false);
    to_bf16_rows(p, T, att + int64_t(i0) * T, T, m, i1, 1.f);
    matmul_bf16(true, false, i1, hs, m, p, T, gi, C, dv, ld, nullptr, false, add);
    for (int t = i0; t < i1; ++t)
      softmax_row_backward<W>(dp + int64_t(t - i0) * T, att + int64_t(t) * T, t + 1, i1, T);
    // dQ[i0:i1] = (scale dS) K[0:i1];  dK[0:i1] (+)= (scale dS)^T Q[i0:i1]
    to_bf16_rows(p, T, dp, T, m, i1, scale);
    matmul_bf16(false, false, m, hs, i1, p, T, k, ld, dq + int64_t(i0) * ld, ld, nullptr, false,
                false);
    matmul_bf16(true, false, i1, hs, m, p, T, q + int64_t(i0) * ld, ld, dk, ld, nullptr, false,
                add);
  }
}

using ForwardHead = void (*)(float*, float*, const float*, int, int, int);
using BackwardHead = void (*)(float*, float*, const float*, const float*, const float*, int, int,
                              int);

#define STRATA_ATTENTION_VARIANT(suffix, attr, W)                                              \
  attr void forward_head_##suffix(float* out, float* att, const float* qkv, int T, int C,     \
                                  int hs) {                                                   \
    forward_head<W>(out, att, qkv, T, C, hs);                                                 \
  }                                                                                           \
  attr void backward_head_##suffix(float* dqkv, float* dp, const float* dout,                 \
                                   const float* qkv, const float* att, int T, int C, int hs) { \
    backward_head<W>(dqkv, dp, dout, qkv, att, T, C, hs);                                     \
  }

STRATA_ISA_VARIANTS(STRATA_ATTENTION_VARIANT, "avx2")

// bf16 runs only where the CPU has AVX512_BF16 (select_backend refuses it elsewhere).
STRATA_ISA_TARGET("avx512f")
void forward_head_bf16_avx512(float* out, float* att, const bf16_t* qkv, int T, int C, int hs) {
  forward_head_bf16<16>(out, att, qkv, T, C, hs);
}
STRATA_ISA_TARGET("avx512f")
void backward_head_bf16_avx512(float* dqkv, float* dp, const bf16_t* g, const bf16_t* qkv,
                               const float* att, int T, int C, int hs) {
  backward_head_bf16<16>(dqkv, dp, g, qkv, att, T, C, hs);
}

// qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T): one (batch, head) per loop iteration. X: the
// inputs' type (float, or bf16_t: rounded copies).
template <class X>
void forward_heads(void (*head)(float*, float*, const X*, int, int, int), float* out,
                   float* att, const X* qkv, int B, int T, int C, int NH) {
  STRATA_CHECK(NH > 0 && C % NH == 0, "attention: C = {} is not a multiple of NH = {}", C, NH);
  const int hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    head(out + int64_t(b) * T * C + int64_t(h) * hs, att + int64_t(bh) * T * T,
         qkv + int64_t(b) * T * 3 * C + int64_t(h) * hs, T, C, hs);
  }
}

// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) -> dqkv (B,T,3C)
template <class X>
void backward_heads(void (*head)(float*, float*, const X*, const X*, const float*, int, int, int),
                    float* dqkv, const X* dout, const X* qkv, const float* att, int B, int T,
                    int C, int NH) {
  STRATA_CHECK(NH > 0 && C % NH == 0, "attention: C = {} is not a multiple of NH = {}", C, NH);
  const int hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qkv_off = int64_t(b) * T * 3 * C + int64_t(h) * hs;
    head(dqkv + qkv_off, thread_scratch(size_t(kBlock) * size_t(T)),
         dout + int64_t(b) * T * C + int64_t(h) * hs, qkv + qkv_off, att + int64_t(bh) * T * T,
         T, C, hs);
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  static const ForwardHead head =
      pick_isa(forward_head_avx512, forward_head_avx2, forward_head_generic);
  forward_heads<float>(head, out, att, qkv, B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  static const BackwardHead head =
      pick_isa(backward_head_avx512, backward_head_avx2, backward_head_generic);
  backward_heads<float>(head, dqkv, dout, qkv, att, B, T, C, NH);
}

namespace bf16 {

// Slots 1 and 2 of the calling thread's bf16 buffers (the heads' threads use slot 0).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int64_t n = int64_t(B) * T * 3 * C;
  const bf16_t* q16 = to_bf16_scratch(1, qkv, n);
  forward_heads<bf16_t>(forward_head_bf16_avx512, out, att, q16, B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  const int64_t n = int64_t(B) * T * 3 * C;
  const bf16_t* q16 = to_bf16_scratch(1, qkv, n);
  const bf16_t* g16 = to_bf16_scratch(2, dout, n / 3);
  backward_heads<bf16_t>(backward_head_bf16_avx512, dqkv, g16, q16, att, B, T, C, NH);
}

}  // namespace bf16
}  // namespace strata::cpu
