// Causal multi-head self-attention on GPT-2's packed qkv (B,T,3C), forward and backward.
//
// Each (batch, head) pair is one independent problem, run start to end by one OpenMP thread, so
// results are bitwise the same for any thread count.
//
// The products are strata's own register-tiled kernel (`tile`), not library GEMMs: a head's
// products are small (T x hs by hs x T, hs = 64 in GPT-2), and oneDNN's sgemm, called per block
// of 64 query rows, ran them at ~40 % of this core's peak; a step of the benchmark GPT is ~1 %
// faster with `tile` (benchmarks/README.md). `tile` keeps an R x NV*W block of C in registers
// and walks the inner dimension broadcasting one element of A and loading NV vectors of B's
// row, so A may have any strides (a transposed operand costs nothing) and B only needs whole
// vectors in its rows: each head's operands are first copied into small padded buffers (q, k,
// v, dout rows; k and v transposed), which also takes the packed layout's 3C row stride out of
// the inner loops (reading q in place from it, the forward waited on memory ~30 % longer).
//
// Causality is used, not masked: query rows go in groups of R (6 with AVX-512) and a group's
// products run only over the keys its last row may see, so the products do ~(T + R) / 2T of
// the full square (51 % at T = 256). Softmax works on a group's rows right after its score
// product, while they are in cache.
//
// The kernels are written once over GCC vector types of W floats and compiled three times,
// picked at run time (dispatch.h): AVX-512 (W = 16), AVX2 (W = 8) and baseline x86-64 (W = 4).
// Softmax's exp is a polynomial on W lanes (lanes.h). Sums over the head dimension and over
// keys run in a fixed order in every build; row sums of the softmax run in W lanes, so the
// last bits of a result depend on the machine's vector width (never on the thread count).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "strata/error.h"
#include "dispatch.h"
#include "lanes.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

using simd::Lanes;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// Register tiling per build: R rows by NV vectors of C (R * NV accumulators, NV vectors of B and
// one broadcast of A live at once: 30 of AVX-512's 32 registers, 11 of AVX2's and SSE's 16).
template <int W> struct Tiling { static constexpr int R = 4, NV = 2; };
template <> struct Tiling<16> { static constexpr int R = 6, NV = 4; };

// C(R, n) = alpha * A(R, K) B(K, n) for n <= NV*W: A(r, k) = a[r*ars + k*acs]; B(k, .) = the
// vectors at b + k*ldb (rows padded to NV*W: lanes past n are read, never stored); C's rows at
// stride ldc, each with `room` >= n writable floats (stores past n, up to room, may happen).
template <int W, int R, int NV>
STRATA_INLINE void tile(float* c, int64_t ldc, int n, int room, const float* a, int64_t ars,
                        int64_t acs, const float* b, int64_t ldb, int K, float alpha) {
  using V = Lanes<W>;
  using F = typename V::F;
  F acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = F{};
  for (int k = 0; k < K; ++k) {
    F bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = V::load(b + int64_t(k) * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const F av = V::splat(a[r * ars + int64_t(k) * acs]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      const int left = n - v * W;
      float* p = c + r * ldc + v * W;
      if (left >= W) V::store(p, acc[r][v] * alpha);
      else if (left > 0) V::store_tail(p, acc[r][v] * alpha, left, room - v * W);
    }
}

// C(rows, n) = alpha * A(rows, K) B(K, n) for rows <= Tiling<W>::R and any n: the column range in
// chunks of NV*W (the last with as few vectors as it needs), each chunk one `tile`.
template <int W, int R>
STRATA_INLINE void tile_rows(float* c, int64_t ldc, int n, int room, const float* a, int64_t ars,
                             int64_t acs, const float* b, int64_t ldb, int K, float alpha) {
  constexpr int NV = Tiling<W>::NV;
  for (int c0 = 0; c0 < n; c0 += NV * W) {
    const int cols = std::min(NV * W, n - c0), nv = (cols + W - 1) / W;
    float* cc = c + c0;
    const float* bb = b + c0;
    if (nv == NV) tile<W, R, NV>(cc, ldc, cols, room - c0, a, ars, acs, bb, ldb, K, alpha);
    else if (nv == 1) tile<W, R, 1>(cc, ldc, cols, room - c0, a, ars, acs, bb, ldb, K, alpha);
    else if constexpr (NV > 2) {
      if (nv == 2) tile<W, R, 2>(cc, ldc, cols, room - c0, a, ars, acs, bb, ldb, K, alpha);
      else tile<W, R, 3>(cc, ldc, cols, room - c0, a, ars, acs, bb, ldb, K, alpha);
    }
  }
}

// tile_rows for a run-time row count 1 <= rows <= Tiling<W>::R.
template <int W>
STRATA_INLINE void product(int rows, float* c, int64_t ldc, int n, int room, const float* a,
                           int64_t ars, int64_t acs, const float* b, int64_t ldb, int K,
                           float alpha) {
  static_assert(Tiling<W>::R == 4 || Tiling<W>::R == 6);
  switch (rows) {
    case 1: return tile_rows<W, 1>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
    case 2: return tile_rows<W, 2>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
    case 3: return tile_rows<W, 3>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
    case 4: return tile_rows<W, 4>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
  }
  if constexpr (Tiling<W>::R == 6) {
    if (rows == 5) return tile_rows<W, 5>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
    return tile_rows<W, 6>(c, ldc, n, room, a, ars, acs, b, ldb, K, alpha);
  }
}

// dst (T, ldd) <- src's T rows of hs floats at stride lds, zero-padded to ldd columns.
template <int W>
STRATA_INLINE void pack_rows(float* dst, int ldd, const float* src, int64_t lds, int T, int hs) {
  using V = Lanes<W>;
  const int full = hs / W * W;
  for (int t = 0; t < T; ++t) {
    float* d = dst + int64_t(t) * ldd;
    const float* s = src + t * lds;
    for (int j = 0; j < full; j += W) V::store(d + j, V::load(s + j));
    for (int j = full; j < hs; ++j) d[j] = s[j];
    std::fill(d + hs, d + ldd, 0.f);
  }
}

// dst (hs, ldd) <- the transpose of src's T rows of hs floats at stride lds, zero-padded to ldd
// columns: W x W blocks through registers, the edges element by element.
template <int W>
STRATA_INLINE void pack_transposed(float* dst, int ldd, const float* src, int64_t lds, int T,
                                   int hs) {
  using V = Lanes<W>;
  using F = typename V::F;
  const int Tf = T / W * W, hf = hs / W * W;
  for (int t0 = 0; t0 < Tf; t0 += W)
    for (int d0 = 0; d0 < hf; d0 += W) {
      F r[W];
      for (int i = 0; i < W; ++i) r[i] = V::load(src + (t0 + i) * lds + d0);
      V::transpose(r);
      for (int i = 0; i < W; ++i) V::store(dst + int64_t(d0 + i) * ldd + t0, r[i]);
    }
  for (int d = 0; d < hs; ++d) {
    const int t_from = d < hf ? Tf : 0;  // rows past hf were not done by the blocks at all
    for (int t = t_from; t < T; ++t) dst[int64_t(d) * ldd + t] = src[t * lds + d];
    std::fill(dst + int64_t(d) * ldd + T, dst + int64_t(d + 1) * ldd, 0.f);
  }
}

constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Floats of per-thread scratch a head needs (the padded operand copies and, in backward, the
// (T,T) score gradients), and where each piece starts: every piece on a 64-byte line.
struct HeadScratch {
  int Tp, hsp;  // T and hs rounded up to whole chunks of the tiling
  float *kt, *vt, *qh, *kh, *vh, *doh, *ds;
  static constexpr int kChunk = Tiling<16>::NV * 16;  // the widest build's: one size for all
  static size_t floats(int T, int hs) {
    const size_t Tp = size_t(round_up(T, kChunk)), hsp = size_t(round_up(hs, kChunk));
    return 2 * size_t(hs) * Tp + 4 * size_t(T) * hsp + size_t(T) * size_t(T) + 16 * 8;
  }
  HeadScratch(float* base, int T, int hs) {
    Tp = round_up(T, kChunk);
    hsp = round_up(hs, kChunk);
    float* p = align(base);
    auto take = [&](size_t n) { float* q = p; p = align(p + n); return q; };
    kt = take(size_t(hs) * Tp);
    vt = take(size_t(hs) * Tp);
    qh = take(size_t(T) * hsp);
    kh = take(size_t(T) * hsp);
    vh = take(size_t(T) * hsp);
    doh = take(size_t(T) * hsp);
    ds = take(size_t(T) * T);
  }
  static float* align(float* p) {
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
  }
};

// One (batch, head) of the problem: its slices of the tensors. q, k, v: (T,hs) with row stride
// 3C (head columns of the packed qkv, k at +C, v at +2C); out, dout: (T,hs) with row stride C;
// att: (T,T); dqkv: as qkv.
struct Head {
  const float* qkv;
  float* att;
  float* out;         // forward
  const float* dout;  // backward
  float* dqkv;        // backward
};

// Forward of one head: out = softmax(scale Q K^T + causal mask) V, att = the softmax, written
// whole (zeros above the diagonal).
template <int W>
STRATA_INLINE void forward_head(const Head& h, int T, int C, int hs,
                                float* scratch) {
  constexpr int R = Tiling<W>::R;
  const int64_t ld = 3 * C;
  HeadScratch s(scratch, T, hs);
  pack_rows<W>(s.qh, s.hsp, h.qkv, ld, T, hs);             // Q (T, hsp)
  pack_transposed<W>(s.kt, s.Tp, h.qkv + C, ld, T, hs);  // K^T (hs, Tp)
  pack_rows<W>(s.vh, s.hsp, h.qkv + 2 * C, ld, T, hs);    // V (T, hsp)
  const float scale = 1.f / std::sqrt(float(hs));
  for (int i0 = 0; i0 < T; i0 += R) {
    const int rows = std::min(R, T - i0), n = i0 + rows;  // keys 0..n-1 are visible to the group
    float* p = h.att + int64_t(i0) * T;
    // S[i0:i0+rows, 0:n] = scale * Q K[0:n]^T
    product<W>(rows, p, T, n, T, s.qh + int64_t(i0) * s.hsp, s.hsp, 1, s.kt, s.Tp, hs, scale);
    for (int t = i0; t < n; ++t) softmax_row_forward<W>(h.att + int64_t(t) * T, t + 1, T);
    // out[i0:i0+rows] = P[., 0:n] V[0:n]  (P is zero above the diagonal)
    product<W>(rows, h.out + int64_t(i0) * C, C, hs, hs, p, T, 1, s.vh, s.hsp, n, 1.f);
  }
}

// Backward of one head, gradients in the layouts of forward_head.
template <int W>
STRATA_INLINE void backward_head(const Head& h, int T, int C, int hs,
                                 float* scratch) {
  constexpr int R = Tiling<W>::R;
  const int64_t ld = 3 * C;
  float* dq = h.dqkv;
  float* dk = h.dqkv + C;
  float* dv = h.dqkv + 2 * C;
  const float* att = h.att;
  HeadScratch s(scratch, T, hs);
  pack_rows<W>(s.qh, s.hsp, h.qkv, ld, T, hs);
  pack_rows<W>(s.kh, s.hsp, h.qkv + C, ld, T, hs);
  pack_transposed<W>(s.vt, s.Tp, h.qkv + 2 * C, ld, T, hs);  // V^T (hs, Tp)
  pack_rows<W>(s.doh, s.hsp, h.dout, C, T, hs);
  const float scale = 1.f / std::sqrt(float(hs));
  float* ds = s.ds;  // (T, T): dP, then dS in place
  for (int i0 = 0; i0 < T; i0 += R) {
    const int rows = std::min(R, T - i0), n = i0 + rows;
    // dP[i0:i0+rows, 0:n] = dO V[0:n]^T
    product<W>(rows, ds + int64_t(i0) * T, T, n, T, s.doh + int64_t(i0) * s.hsp, s.hsp, 1, s.vt,
               s.Tp, hs, 1.f);
    // dS = P * (dP - rowsum(P * dP)), then zeros for R - 1 columns past the diagonal: the dQ
    // product reads a group's rows up to its last row's diagonal, the dK product a group's
    // columns down from its first row.
    for (int t = i0; t < n; ++t)
      softmax_row_backward<W>(ds + int64_t(t) * T, att + int64_t(t) * T, t + 1,
                              std::min(T, t + R), T);
    // dQ[i0:i0+rows] = scale * dS[., 0:n] K[0:n]
    product<W>(rows, dq + i0 * ld, ld, hs, hs, ds + int64_t(i0) * T, T, 1, s.kh, s.hsp, n, scale);
  }
  // Key rows j in groups of R: dV[j] = sum_{i >= j0} P[i][j] dO[i], dK[j] = scale * sum dS[i][j]
  // Q[i] (A is P^T or dS^T: its rows are the columns of att or ds; zero where i < j).
  for (int j0 = 0; j0 < T; j0 += R) {
    const int rows = std::min(R, T - j0), K = T - j0;
    product<W>(rows, dv + j0 * ld, ld, hs, hs, att + int64_t(j0) * T + j0, 1, T,
               s.doh + int64_t(j0) * s.hsp, s.hsp, K, 1.f);
    product<W>(rows, dk + j0 * ld, ld, hs, hs, ds + int64_t(j0) * T + j0, 1, T,
               s.qh + int64_t(j0) * s.hsp, s.hsp, K, scale);
  }
}

using HeadKernel = void (*)(const Head&, int, int, int, float*);

#define STRATA_ATTENTION_VARIANT(suffix, attr, W)                                      \
  attr void forward_head_##suffix(const Head& h, int T, int C, int hs, float* scratch) {  \
    forward_head<W>(h, T, C, hs, scratch);                                            \
  }                                                                                   \
  attr void backward_head_##suffix(const Head& h, int T, int C, int hs, float* scratch) { \
    backward_head<W>(h, T, C, hs, scratch);                                           \
  }

STRATA_ISA_VARIANTS(STRATA_ATTENTION_VARIANT, "avx2,fma")

// The (batch, head) pairs, each run start to end by one thread.
void for_each_head(HeadKernel kernel, int B, int T, int C, int NH, const float* qkv, float* att,
                   float* out, const float* dout, float* dqkv) {
  const int hs = C / NH;
  auto head = [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const int64_t x1 = int64_t(b) * T * C + int64_t(h) * hs, x3 = int64_t(b) * T * 3 * C + int64_t(h) * hs;
    return Head{qkv + x3, att + int64_t(bh) * T * T, out ? out + x1 : nullptr,
                dout ? dout + x1 : nullptr, dqkv ? dqkv + x3 : nullptr};
  };
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * NH; ++bh)
    kernel(head(bh), T, C, hs, thread_scratch(HeadScratch::floats(T, hs)));
}

void check_heads(int C, int NH) {
  STRATA_CHECK(NH > 0 && C % NH == 0, "attention: C = {} is not a multiple of NH = {}", C, NH);
}


}  // namespace

// qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T)
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  check_heads(C, NH);
  static const HeadKernel kernel =
      pick_isa(forward_head_avx512, forward_head_avx2, forward_head_generic);
  for_each_head(kernel, B, T, C, NH, qkv, att, out, nullptr, nullptr);
}

// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) -> dqkv (B,T,3C)
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  check_heads(C, NH);
  static const HeadKernel kernel =
      pick_isa(backward_head_avx512, backward_head_avx2, backward_head_generic);
  for_each_head(kernel, B, T, C, NH, qkv, const_cast<float*>(att), nullptr, dout, dqkv);
}

}  // namespace strata::cpu
