// Register-tiled fp32 GEMM on AVX-512 for small-row products (small_gemm.h says why).
#include "small_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>

#include "dispatch.h"

namespace strata::cpu {

bool small_gemm_supported() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// GCC 12's AVX-512 shuffle and masked intrinsics pass undefined vectors that -Wuninitialized
// flags inside the header (GCC bug 105593): off for this file's kernels.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

// A tile: up to 24 accumulators of C, with its B vectors and a broadcast of A in the other 8
// of the 32 registers. 6 rows of 4 vectors (64 columns), or 8 rows where a block of columns
// has 3 vectors or fewer (8 x 3 measured faster than 6 x 3: 11 loads per 24 FMAs, not 9 per
// 18). 4 x 6, 3 x 6 and 8 x 3 throughout measured slower on the MLP than 6 x 4.
constexpr int kVecs = 4;     // the most vectors of columns in a tile
constexpr int kMaxRows = 8;  // the most rows, at 3 vectors or fewer
int max_rows(int vecs) { return vecs <= 3 ? 8 : 6; }

inline __mmask16 first_lanes(int n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// One tile: R rows x V vectors of C (the last vector's lanes `last` when Tail), over all of K,
// each sum from zero (then added to C when accumulate). The accumulators are named variables,
// not an array: GCC at -O3 kept an array's copy on the stack and stored all 24 to it at every
// k (a third of the peak).
#define STRATA_TILE_ROW(X, r) X(r, 0) X(r, 1) X(r, 2) X(r, 3) X(r, 4) X(r, 5)
#define STRATA_TILE(X)                                                              \
  STRATA_TILE_ROW(X, 0) STRATA_TILE_ROW(X, 1) STRATA_TILE_ROW(X, 2)                 \
  STRATA_TILE_ROW(X, 3) STRATA_TILE_ROW(X, 4) STRATA_TILE_ROW(X, 5)                 \
  STRATA_TILE_ROW(X, 6) STRATA_TILE_ROW(X, 7)
#define STRATA_EACH_VEC(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define STRATA_EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
// The steps both tiles share, expanded for each accumulator c<r><v> or vector v.
#define STRATA_MASK(v) const __mmask16 m##v = Tail && V == v + 1 ? last : 0xffff;
#define STRATA_ZERO(r, v) __m512 c##r##v = _mm512_setzero_ps();
#define STRATA_LOAD_B(v)                                                                  \
  const __m512 b##v = V <= v ? _mm512_setzero_ps()                                        \
                      : Tail ? _mm512_maskz_loadu_ps(m##v, b + 16 * v)                    \
                             : _mm512_loadu_ps(b + 16 * v);
#define STRATA_STORE(r, v)                                                                \
  if constexpr (R > r && V > v) {                                                         \
    float* c = C + r * ldc + 16 * v;                                                      \
    __m512 x = c##r##v;                                                                   \
    if (accumulate) x = _mm512_add_ps(_mm512_maskz_loadu_ps(m##v, c), x);                 \
    if (col_bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m##v, col_bias + 16 * v));   \
    if (Tail) _mm512_mask_storeu_ps(c, m##v, x);                                          \
    else _mm512_storeu_ps(c, x);                                                          \
  }

template <int R, int V, bool Tail>
STRATA_ISA_TARGET("avx512f")
void tile(int K, const float* A, int64_t a_row, int64_t a_col, const float* B, int64_t ldb,
          float* C, int64_t ldc, __mmask16 last, bool accumulate) {
  constexpr const float* col_bias = nullptr;
  STRATA_EACH_VEC(STRATA_MASK)
  STRATA_TILE(STRATA_ZERO)
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * a_col;
    STRATA_EACH_VEC(STRATA_LOAD_B)
#define STRATA_FMA(r, v) \
    if constexpr (R > r && V > v) c##r##v = _mm512_fmadd_ps(_mm512_set1_ps(a[r * a_row]), b##v, c##r##v);
    STRATA_TILE(STRATA_FMA)
#undef STRATA_FMA
  }
  STRATA_TILE(STRATA_STORE)
}

// A tile whose A is gathered: element (r, k) at A[row_off[r] + k_off[k]] (a convolution's input
// read in place as its im2col matrix), C's column n then getting col_bias[n] when given. The
// same sums in the same order as `tile` would make of the im2col matrix; kept apart from it so
// the strided tile's code stays as it is (one function for both measured 7 % slower on the
// MLP's weight gradient).
template <int R, int V, bool Tail>
STRATA_ISA_TARGET("avx512f")
void tile_gathered(int K, const float* A, const int64_t* row_off, const int64_t* k_off,
                   const float* B, int64_t ldb, float* C, int64_t ldc, __mmask16 last,
                   bool accumulate, const float* col_bias) {
  STRATA_EACH_VEC(STRATA_MASK)
  STRATA_TILE(STRATA_ZERO)
#define STRATA_AROW(r) const float* a##r = A + (R > r ? row_off[r] : 0);
  STRATA_EACH_ROW(STRATA_AROW)
#undef STRATA_AROW
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const int64_t o = k_off[k];
    STRATA_EACH_VEC(STRATA_LOAD_B)
#define STRATA_FMA(r, v) \
    if constexpr (R > r && V > v) c##r##v = _mm512_fmadd_ps(_mm512_set1_ps(a##r[o]), b##v, c##r##v);
    STRATA_TILE(STRATA_FMA)
#undef STRATA_FMA
  }
  STRATA_TILE(STRATA_STORE)
}
#undef STRATA_STORE
#undef STRATA_LOAD_B
#undef STRATA_ZERO
#undef STRATA_MASK
#undef STRATA_EACH_ROW
#undef STRATA_EACH_VEC
#undef STRATA_TILE
#undef STRATA_TILE_ROW

using TileFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*,
                        int64_t, __mmask16, bool);

using GatheredFn = void (*)(int, const float*, const int64_t*, const int64_t*, const float*,
                            int64_t, float*, int64_t, __mmask16, bool, const float*);

// The two kernel families, for tile_for.
struct Strided {
  using Fn = TileFn;
  template <int R, int V, bool Tail>
  static constexpr Fn get() { return tile<R, V, Tail>; }
};
struct Gathered {
  using Fn = GatheredFn;
  template <int R, int V, bool Tail>
  static constexpr Fn get() { return tile_gathered<R, V, Tail>; }
};

// Family's tile for R rows and V vectors, or null where R x V is not a tile (> 24).
template <class Family, bool Tail, int R, int V>
constexpr typename Family::Fn tile_fn() {
  if constexpr (R * V <= 24) return Family::template get<R, V, Tail>();
  else return nullptr;
}
template <class Family, bool Tail, size_t... I>
constexpr std::array<typename Family::Fn, sizeof...(I)> tile_table(std::index_sequence<I...>) {
  return {tile_fn<Family, Tail, int(I) / kVecs + 1, int(I) % kVecs + 1>()...};
}
template <class Family, bool Tail>
typename Family::Fn tile_for(int rows, int vecs) {
  static constexpr auto table =
      tile_table<Family, Tail>(std::make_index_sequence<kMaxRows * kVecs>());
  return table[(rows - 1) * kVecs + vecs - 1];
}

// Calls tile(m, rows, n, vecs, tail, last) for each tile of C (M,N): blocks of up to kVecs
// vectors of columns and tiles of up to max_rows rows, both as even as they go (a remainder of
// one vector, the CNN's 196 = 12 x 16 + 4 columns, or of two rows, the MLP's 128 = 21 x 6 + 2,
// ran its tiles at a third of the others' speed). Row tiles inside: the B panel (K x 16 * vecs)
// stays in cache across them. (Blocks of K that kept it in L1, their sums continued through C,
// measured slower on the MLP's K = 784 and the CNN's K = 288.)
template <class Tile>
void for_each_tile(int M, int N, const Tile& tile) {
  const int vectors = (N + 15) / 16, blocks = (vectors + kVecs - 1) / kVecs;
  for (int blk = 0, n = 0; blk < blocks; ++blk) {
    const int vecs = vectors / blocks + (blk < vectors % blocks ? 1 : 0);
    const int nc = std::min(16 * vecs, N - n);
    const __mmask16 last = first_lanes(nc - 16 * (vecs - 1));
    const int tiles = (M + max_rows(vecs) - 1) / max_rows(vecs);
    for (int t = 0, m = 0; t < tiles; ++t) {
      const int rows = M / tiles + (t < M % tiles ? 1 : 0);
      tile(m, rows, n, vecs, nc % 16 != 0, last);
      m += rows;
    }
    n += nc;
  }
}

// dst (cols x rows, ldd) = the transpose of src (rows x cols, lds), rows, cols <= 16, in
// registers: lanes past `cols` load as zero and rows past `rows` are not stored. With a bias
// (one per dst column, the src rows' index), dst = src^T + bias, then ReLU when relu.
STRATA_ISA_TARGET("avx512f")
void transpose16(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd,
                 const float* bias, bool relu) {
  const __mmask16 in = first_lanes(cols), out = first_lanes(rows);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(in, src + i * lds) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit interleave
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int h = 0; h < 16; h += 8)  // 128-bit lanes, within each half of the rows
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {  // and across the halves
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  const __m512 b = bias ? _mm512_maskz_loadu_ps(out, bias) : _mm512_setzero_ps();
  for (int j = 0; j < cols; ++j) {
    __m512 x = bias ? _mm512_add_ps(r[j], b) : r[j];
    if (relu) x = _mm512_max_ps(x, _mm512_setzero_ps());
    _mm512_mask_storeu_ps(dst + j * ldd, out, x);
  }
}

// dst (cols x rows) = src (rows x cols)^T [+ bias per dst column] [ReLU], in 16 x 16 blocks.
void transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd,
               const float* bias = nullptr, bool relu = false) {
  for (int i = 0; i < rows; i += 16)
    for (int j = 0; j < cols; j += 16)
      transpose16(src + i * lds + j, lds, std::min(16, rows - i), std::min(16, cols - j),
                  dst + j * ldd + i, ldd, bias ? bias + i : nullptr, relu);
}

}  // namespace
#pragma GCC diagnostic pop

void small_gemm(int M, int N, int K, const float* A, int64_t a_row, int64_t a_col,
                const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (!small_gemm_supported()) throw std::logic_error("small_gemm: needs AVX-512F");
  if (M <= 0 || N <= 0) return;
  for_each_tile(M, N, [&](int m, int rows, int n, int vecs, bool tail, __mmask16 last) {
    const TileFn f =
        tail ? tile_for<Strided, true>(rows, vecs) : tile_for<Strided, false>(rows, vecs);
    f(K, A + m * a_row, a_row, a_col, B + n, ldb, C + m * ldc + n, ldc, last, accumulate);
  });
}

void small_gemm_gathered(int M, int N, int K, const float* A, const int64_t* row_off,
                         const int64_t* k_off, const float* B, int64_t ldb, float* C, int64_t ldc,
                         bool accumulate, const float* col_bias) {
  if (!small_gemm_supported()) throw std::logic_error("small_gemm: needs AVX-512F");
  if (M <= 0 || N <= 0) return;
  for_each_tile(M, N, [&](int m, int rows, int n, int vecs, bool tail, __mmask16 last) {
    const GatheredFn f =
        tail ? tile_for<Gathered, true>(rows, vecs) : tile_for<Gathered, false>(rows, vecs);
    f(K, A, row_off + m, k_off, B + n, ldb, C + m * ldc + n, ldc, last, accumulate,
      col_bias ? col_bias + n : nullptr);
  });
}

void small_transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd) {
  if (!small_gemm_supported()) throw std::logic_error("small_transpose: needs AVX-512F");
  transpose(src, lds, rows, cols, dst, ldd);
}

void small_linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                          int B, int I, int O, bool relu) {
  if (B <= 0 || O <= 0) return;
  const int64_t ld = (B + 15) / 16 * 16;  // a padded row of the batch
  float* inp_t = thread_scratch(size_t(ld) * (I + O));
  float* out_t = inp_t + ld * I;
  transpose(inp, I, B, I, inp_t, ld);
  small_gemm(O, B, I, weight, I, 1, inp_t, ld, out_t, ld, false);
  transpose(out_t, ld, O, B, out, O, bias, relu);
}

#else
void small_gemm(int, int, int, const float*, int64_t, int64_t, const float*, int64_t, float*,
                int64_t, bool) {
  throw std::logic_error("small_gemm: needs AVX-512F");
}
void small_gemm_gathered(int, int, int, const float*, const int64_t*, const int64_t*,
                         const float*, int64_t, float*, int64_t, bool, const float*) {
  throw std::logic_error("small_gemm: needs AVX-512F");
}
void small_transpose(const float*, int64_t, int, int, float*, int64_t) {
  throw std::logic_error("small_gemm: needs AVX-512F");
}
void small_linear_forward(float*, const float*, const float*, const float*, int, int, int, bool) {
  throw std::logic_error("small_gemm: needs AVX-512F");
}
#endif

}  // namespace strata::cpu
