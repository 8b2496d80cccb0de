// Causal multi-head self-attention on GPT-2's packed qkv (B,T,3C), forward and backward.
//
// Each (batch, head) pair is one independent problem, run start to end by one OpenMP thread, so
// results are bitwise the same for any thread count. Its products are oneDNN sgemms straight
// on the packed layout (a head's q, k or v is a (T,hs) matrix with row stride 3C; its slice of
// out is a (T,hs) matrix with row stride C): no copies in or out. Inside an OpenMP region
// oneDNN runs each sgemm on the calling thread.
//
// Causality is used, not masked: rows are taken in blocks of kBlock queries, and a block's
// products run only over the keys it may see (columns 0..i1 for rows i0..i1), so the products
// do ~(T + kBlock) / 2T of the full square (62% at T = 256). Softmax works on the rows in
// place right after the block's score product, while they are in cache.
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

#include "strata/error.h"
#include "dispatch.h"
#include "strata/kernels_cpu.h"

// The vector helpers below pass vectors by value; they are always inlined into a function
// compiled for the matching target, so the ABI note GCC gives about them never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace strata::cpu {

namespace {

// Query rows per block. 64 measured best at T = 256, hs = 64 (32: more, smaller sgemms; 128
// and unblocked: more masked work), see the [.bench] test in tests/unit/test_gpt_kernels.cpp.
constexpr int kBlock = 64;

#define STRATA_INLINE inline __attribute__((always_inline))

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// W lanes of float (F) and of int32 (I).
typedef float F2 __attribute__((vector_size(8)));
typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I2 __attribute__((vector_size(8)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef int32_t I16 __attribute__((vector_size(64)));
template <int W> struct VecTypes;
template <> struct VecTypes<2> { using F = F2; using I = I2; };
template <> struct VecTypes<4> { using F = F4; using I = I4; };
template <> struct VecTypes<8> { using F = F8; using I = I8; };
template <> struct VecTypes<16> { using F = F16; using I = I16; };

template <int W>
struct Lanes {
  using F = typename VecTypes<W>::F;
  using I = typename VecTypes<W>::I;

  static STRATA_INLINE F load(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static STRATA_INLINE void store(float* p, const F& v) { std::memcpy(p, &v, sizeof v); }
  static STRATA_INLINE F splat(float x) { return F{} + x; }
  static STRATA_INLINE I index() {
    I i{};
    for (int l = 0; l < W; ++l) i[l] = l;
    return i;
  }
  static STRATA_INLINE F max(const F& a, const F& b) { return a > b ? a : b; }

  // The last, partial vector of a row: the n < W floats at p, the other lanes `fill`. When the
  // buffer has room for a whole vector there (room >= W: an att row holds T floats, a causal
  // row uses t+1) it is one load and a lane select (the extra lanes are read, never used);
  // else it goes through a stack buffer.
  static STRATA_INLINE F load_tail(const float* p, int n, int room, float fill) {
    if (room >= W) return index() < n ? load(p) : splat(fill);
    float buf[W];
    for (int l = 0; l < W; ++l) buf[l] = l < n ? p[l] : fill;
    return load(buf);
  }
  // Stores the first n lanes of v at p; all W when room >= W (the caller has given the extra
  // lanes the values that belong there).
  static STRATA_INLINE void store_tail(float* p, const F& v, int n, int room) {
    if (room >= W) return store(p, v);
    float buf[W];
    store(buf, v);
    for (int l = 0; l < n; ++l) p[l] = buf[l];
  }

  // Sum and maximum of the lanes as a fixed tree: the two halves added lane by lane, and so on.
  static STRATA_INLINE float hsum(const F& v) {
    if constexpr (W == 2) {
      return v[0] + v[1];
    } else {
      typename Lanes<W / 2>::F lo, hi;
      std::memcpy(&lo, &v, sizeof lo);
      std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
      return Lanes<W / 2>::hsum(lo + hi);
    }
  }
  static STRATA_INLINE float hmax(const F& v) {
    if constexpr (W == 2) {
      return v[1] > v[0] ? v[1] : v[0];
    } else {
      typename Lanes<W / 2>::F lo, hi;
      std::memcpy(&lo, &v, sizeof lo);
      std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
      return Lanes<W / 2>::hmax(Lanes<W / 2>::max(lo, hi));
    }
  }

  // exp(x) for the x <= 0 of a softmax shifted by its maximum (Cephes expf: round x/ln2 to n,
  // two-constant Cody-Waite reduction, degree-6 polynomial on |r| <= ln2/2, times 2^n by the
  // exponent bits; within 2 ulp of the true value). Below -87.3 the result is 0 (the true
  // value is under 1.2e-38, subnormal); -inf gives 0, NaN gives NaN.
  static STRATA_INLINE F exp_nonpos(const F& x) {
    const F lo = splat(-87.33654f);
    const auto under = x < lo;
    const F xc = under ? lo : x;
    const F magic = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
    F n = xc * 1.44269504088896341f + magic;
    n = n - magic;
    F r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    F p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const F y = p * r * r + r + 1.f;
    const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n, n in [-126, 0]
    const F e = y * (F)bits;  // same-size vector cast: the bits as floats
    return under ? F{} : e;
  }
};

// Causal softmax of one row of scores, in place: row[0..L) <- softmax(row[0..L)), then
// row[L..Z) <- 0 (the masked keys). The row buffer holds Z >= L floats.
template <int W>
STRATA_INLINE void softmax_row_forward(float* row, int L, int Z) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int full = L / W * W, n = L - full, room = Z - full;
  F m = V::splat(kNegInf);
  for (int j = 0; j < full; j += W) m = V::max(m, V::load(row + j));
  if (n) m = V::max(m, V::load_tail(row + full, n, room, kNegInf));
  const float mx = V::hmax(m);
  F sum{};
  for (int j = 0; j < full; j += W) {
    const F e = V::exp_nonpos(V::load(row + j) - mx);
    V::store(row + j, e);
    sum += e;
  }
  F tail{};
  if (n) {
    tail = V::exp_nonpos(V::load_tail(row + full, n, room, kNegInf) - mx);  // exp(-inf) = 0
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
    for (int t = i0; t < i1; ++t) softmax_row_forward<W>(att + int64_t(t) * T, t + 1, T);
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

void check_heads(int C, int NH) {
  STRATA_CHECK(NH > 0 && C % NH == 0, "attention: C = {} is not a multiple of NH = {}", C, NH);
}


}  // namespace

// qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T)
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  check_heads(C, NH);
  static const ForwardHead head =
      pick_isa(forward_head_avx512, forward_head_avx2, forward_head_generic);
  const int hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    head(out + int64_t(b) * T * C + int64_t(h) * hs, att + int64_t(bh) * T * T,
         qkv + int64_t(b) * T * 3 * C + int64_t(h) * hs, T, C, hs);
  }
}

// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) -> dqkv (B,T,3C)
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  check_heads(C, NH);
  static const BackwardHead head =
      pick_isa(backward_head_avx512, backward_head_avx2, backward_head_generic);
  const int hs = C / NH;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qkv_off = int64_t(b) * T * 3 * C + int64_t(h) * hs;
    head(dqkv + qkv_off, thread_scratch(size_t(kBlock) * size_t(T)), dout + int64_t(b) * T * C + int64_t(h) * hs,
         qkv + qkv_off, att + int64_t(bh) * T * T, T, C, hs);
  }
}

}  // namespace strata::cpu
