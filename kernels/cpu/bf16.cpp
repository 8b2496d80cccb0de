// bf16 on the CPU: rounding fp32 to bf16, the per-thread buffers the bf16 GEMMs read, and
// whether this CPU runs bf16 GEMMs natively.
//
// The rounding is the CPU's own VCVTNEPS2BF16 (AVX512_BF16: nearest even, NaNs kept NaN, and,
// unlike PyTorch's software rounding, denormal inputs flushed to zero): every element, tails
// included, goes through that one instruction (masked loads and stores), so a tensor rounds
// the same whatever the thread count or chunking. Without AVX512_BF16 strata refuses bf16 on
// the CPU (select_backend) and nothing here runs.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

#if defined(__x86_64__)
// dst[i] = bf16(Scale ? src[i] * scale : src[i]): the unscaled build has no multiply at all.
template <bool Scale>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void round_span_impl(
    bf16_t* dst, const float* src, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(src + i);
    if constexpr (Scale) x = _mm512_mul_ps(x, s);
    const __m256bh v = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(v));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    if constexpr (Scale) x = _mm512_mul_ps(x, s);
    const __m256bh v = _mm512_cvtneps_pbh(x);
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<const __m256i&>(v));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
void round_span(bf16_t* dst, const float* src, int64_t n) {
  round_span_impl<false>(dst, src, n, 1.f);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
void round_span_scaled(bf16_t* dst, const float* src, int64_t n, float scale) {
  round_span_impl<true>(dst, src, n, scale);
}
#endif

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

}  // namespace

void to_bf16(bf16_t* dst, const float* src, int64_t n) {
#if defined(__x86_64__)
  // Large tensors split over the math threads; 64K elements (256 KB read) per piece at least.
  constexpr int64_t kPiece = int64_t(1) << 16;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  if (pieces > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; ++p)
      round_span(dst + p * kPiece, src + p * kPiece, std::min(kPiece, n - p * kPiece));
    return;
  }
  round_span(dst, src, n);
#else
  (void)dst, (void)src, (void)n;
#endif
}

void to_bf16_rows(bf16_t* dst, int64_t ldd, const float* src, int64_t lds, int rows, int cols,
                  float scale) {
#if defined(__x86_64__)
  for (int r = 0; r < rows; ++r) {
    if (scale == 1.f)
      round_span(dst + r * ldd, src + r * lds, cols);
    else
      round_span_scaled(dst + r * ldd, src + r * lds, cols, scale);
  }
#else
  (void)dst, (void)ldd, (void)src, (void)lds, (void)rows, (void)cols, (void)scale;
#endif
}

#if defined(__x86_64__)
namespace {
// Columns [c0, c1) of to_bf16_col_sums: per row, each 16 columns (times `scale`'s, which then
// are also stored to `prod`) rounded and added to their sums (kept in `sums`, in L1 beside the
// row), so each column adds its rows in order. With two streams read the hardware's prefetch
// fell behind: on an AMD EPYC Zen 5, 2048 x 1536 from memory took 1930 us, 890 with both
// prefetched 1 KB ahead (the separate multiply and rounding passes: 1440). One stream it keeps
// up with (570 us; 690 with the prefetches).
template <bool Scaled>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_col_sums(
    bf16_t* dst, const float* src, const float* scale, float* prod, int rows, int cols, int c0,
    int c1, float* sums) {
  for (int r = 0; r < rows; ++r) {
    const int64_t row = int64_t(r) * cols;
    for (int c = c0; c < c1; c += 16) {
      const __mmask16 m = c + 16 <= c1 ? __mmask16(0xffff) : __mmask16((1u << (c1 - c)) - 1);
      if constexpr (Scaled) {  // 1 KB ahead in both streams (prefetches never fault)
        _mm_prefetch(reinterpret_cast<const char*>(src + row + c + 256), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(scale + row + c + 256), _MM_HINT_T0);
      }
      __m512 v = _mm512_maskz_loadu_ps(m, src + row + c);
      if constexpr (Scaled) {
        v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, scale + row + c));
        if (prod) _mm512_mask_storeu_ps(prod + row + c, m, v);
      }
      const __m256bh h = _mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(dst + row + c, m, reinterpret_cast<const __m256i&>(h));
      if (sums)
        _mm512_mask_storeu_ps(sums + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, sums + c), v));
    }
  }
}
}  // namespace
#endif

void to_bf16_col_sums(bf16_t* dst, const float* src, int rows, int cols, float* sums,
                      bool accumulate, const float* scale, float* prod) {
  if (sums && !accumulate) std::fill(sums, sums + cols, 0.f);
#if defined(__x86_64__)
  const auto piece = [&](int c0, int c1) {
    if (scale)
      round_col_sums<true>(dst, src, scale, prod, rows, cols, c0, c1, sums);
    else
      round_col_sums<false>(dst, src, nullptr, nullptr, rows, cols, c0, c1, sums);
  };
  // Threads split the columns, never a column's rows: its sum keeps the rows' order.
  constexpr int kCols = 256;
  const int pieces = (cols + kCols - 1) / kCols;
  if (pieces > 1 && int64_t(rows) * cols >= (int64_t(1) << 16) && omp_get_max_threads() > 1 &&
      !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int p = 0; p < pieces; ++p) piece(p * kCols, std::min(cols, (p + 1) * kCols));
    return;
  }
  piece(0, cols);
#else
  (void)dst, (void)src, (void)rows, (void)scale, (void)prod;
#endif
}

// ---- B operands rounded straight into the matmul's blocked layout --------------------------
// oneDNN 2.6's bf16 brgemm kernels read B (K, N) as BA16a64b2a: blocks of 32 k by 64 n, the
// blocks of one 64-column panel consecutive, panels in n order; inside a block, pairs of k
// rows interleaved: element (k, n) at (k % 32 / 2) * 128 + (n % 64) * 2 + k % 2. K pads to 32,
// N to 64, with zeros.
namespace {

constexpr int kPackK = 32, kPackN = 64;

#if defined(__x86_64__)
// Interleaves the two 16-bf16 halves of v: [a0..a15, b0..b15] -> [a0 b0 a1 b1 ... a15 b15].
__attribute__((target("avx512f,avx512bw"))) inline __m512i interleave_halves(__m512i v) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                    21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                    11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_maskz_permutexvar_epi16(~__mmask32(0), _mm512_load_si512(kIdx), v);
}

__attribute__((target("avx512f"))) inline __mmask16 first(int n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// One 32 x 64 block from B row-major (K, N): rows k0.. and columns n0.. of it. A strip's 32
// rows are read 256 bytes at a time, block after block: 32 streams, too many for the
// hardware's prefetchers (on an AMD EPYC Zen 5 a cold 2048 x 1536 B packed in 1240 us, 785 with
// each row's next 256 bytes prefetched a block ahead: 1.6x; 2048 x 384: 1.85x).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void pack_block(
    bf16_t* blk, const float* B, int64_t ldb, int K, int N, int k0, int n0) {
  for (int kk = 0; kk < kPackK / 2; ++kk) {
    const int k = k0 + 2 * kk;
    for (int c = 0; c < kPackN / 16; ++c) {
      const int n = n0 + 16 * c;
      const __mmask16 m = first(N - n);
      if (k + 1 < K) {  // the next panel's same lines (prefetches never fault past the end)
        _mm_prefetch(reinterpret_cast<const char*>(B + k * ldb + n + kPackN), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(B + (k + 1) * ldb + n + kPackN), _MM_HINT_T0);
      }
      const __m512 a = k < K ? _mm512_maskz_loadu_ps(m, B + k * ldb + n) : _mm512_setzero_ps();
      const __m512 b =
          k + 1 < K ? _mm512_maskz_loadu_ps(m, B + (k + 1) * ldb + n) : _mm512_setzero_ps();
      const __m512bh v = _mm512_cvtne2ps_pbh(b, a);  // a's 16 low, b's 16 high
      _mm512_storeu_si512(blk + kk * 128 + c * 32,
                          interleave_halves(reinterpret_cast<const __m512i&>(v)));
    }
  }
}

// The 16 x 16 32-bit units u[r] (row r) transposed in place: u[j] ends as column j. (The
// maskz forms throughout: GCC 12 warns about the "undefined" pass-through of the plain ones.)
__attribute__((target("avx512f"))) inline void transpose_16x16_u32(__m512i* u) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(0xffff, u[i], u[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, u[i], u[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_maskz_unpacklo_epi64(0xff, t[i], t[i + 2]);
    u[i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[i], t[i + 2]);
    u[i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[i + 1], t[i + 3]);
  }
  // Lane L of u[4q + j] now holds rows 4q..4q+3 of column 4L + j: column c's four lanes are
  // lane c / 4 of u[c % 4], u[4 + c % 4], u[8 + c % 4] and u[12 + c % 4].
  // a, b: lanes (0, 2) and (1, 3) of the first two quads; c, d: of the last two.
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_maskz_shuffle_i32x4(0xffff, u[j], u[4 + j], 0x88);
    const __m512i b = _mm512_maskz_shuffle_i32x4(0xffff, u[j], u[4 + j], 0xdd);
    const __m512i c = _mm512_maskz_shuffle_i32x4(0xffff, u[8 + j], u[12 + j], 0x88);
    const __m512i d = _mm512_maskz_shuffle_i32x4(0xffff, u[8 + j], u[12 + j], 0xdd);
    t[j] = _mm512_maskz_shuffle_i32x4(0xffff, a, c, 0x88);       // lane 0s: column j
    t[4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, b, d, 0x88);   // lane 1s: column 4 + j
    t[8 + j] = _mm512_maskz_shuffle_i32x4(0xffff, a, c, 0xdd);   // lane 2s: column 8 + j
    t[12 + j] = _mm512_maskz_shuffle_i32x4(0xffff, b, d, 0xdd);  // lane 3s: column 12 + j
  }
  for (int i = 0; i < 16; ++i) u[i] = t[i];
}

// One 32 x 64 block from B^T: W row-major (N, K) holds element (k, n) at W[n * ldw + k]. 64
// streams of 128 bytes a block: the next block's lines prefetched as pack_block's (Zen 5, a
// cold 384 x 1152 weight: 268 -> 116 us; 1536 x 384: 373 -> 216 us; 384 x 1536: 362 -> 290 us).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void pack_block_transposed(
    bf16_t* blk, const float* W, int64_t ldw, int K, int N, int k0, int n0) {
  const __mmask16 lo = first(K - k0), hi = first(K - k0 - 16);
  for (int c = 0; c < kPackN / 16; ++c) {
    __m512i u[16];
    for (int r = 0; r < 16; ++r) {
      const int n = n0 + 16 * c + r;
      if (n >= N) {
        u[r] = _mm512_setzero_si512();
        continue;
      }
      const float* row = W + n * ldw + k0;
      _mm_prefetch(reinterpret_cast<const char*>(row + kPackK), _MM_HINT_T0);  // the next block's
      _mm_prefetch(reinterpret_cast<const char*>(row + kPackK + 16), _MM_HINT_T0);
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, row + 16),
                                             _mm512_maskz_loadu_ps(lo, row));
      u[r] = reinterpret_cast<const __m512i&>(v);  // 32-bit unit kk: the pair (k0+2kk, +1)
    }
    transpose_16x16_u32(u);
    for (int kk = 0; kk < kPackK / 2; ++kk) _mm512_storeu_si512(blk + kk * 128 + c * 32, u[kk]);
  }
}
#endif

}  // namespace

int64_t packed_b_elems(int K, int N) {
  return int64_t((K + kPackK - 1) / kPackK * kPackK) * ((N + kPackN - 1) / kPackN * kPackN);
}

void to_bf16_packed_b(bf16_t* dst, const float* B, int64_t ldb, bool trans, int K, int N) {
#if defined(__x86_64__)
  const int kb = (K + kPackK - 1) / kPackK, nb = (N + kPackN - 1) / kPackN;
  const int64_t block = kPackK * kPackN;
  auto at = [&](int p, int q) { return dst + (int64_t(p) * kb + q) * block; };
  // B^T: a panel's 64 rows of W read along, 32 floats at a time. B: 32 of its rows at a time,
  // read whole and in order, into one block of each panel (panel by panel, 256 bytes of each
  // of the K rows per pass, ran 1.15x slower on 2048 x 1536: 601 against 522 us, one run each).
  auto strip = [&](int i) {
    if (trans)
      for (int q = 0; q < kb; ++q)
        pack_block_transposed(at(i, q), B, ldb, K, N, q * kPackK, i * kPackN);
    else
      for (int p = 0; p < nb; ++p) pack_block(at(p, i), B, ldb, K, N, i * kPackK, p * kPackN);
  };
  const int strips = trans ? nb : kb;
  if (strips > 1 && int64_t(K) * N >= (int64_t(1) << 16) && omp_get_max_threads() > 1 &&
      !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < strips; ++i) strip(i);
    return;
  }
  for (int i = 0; i < strips; ++i) strip(i);
#else
  (void)dst, (void)B, (void)ldb, (void)trans, (void)K, (void)N;
#endif
}

bf16_t* bf16_scratch(int slot, size_t n) {
  thread_local std::vector<bf16_t> bufs[kBf16ScratchSlots];
  std::vector<bf16_t>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

const bf16_t* to_bf16_scratch(int slot, const float* x, int64_t n) {
  bf16_t* r = bf16_scratch(slot, size_t(n));
  to_bf16(r, x, n);
  return r;
}

bool bf16_supported(std::string* why) {
  // Asked once per backend selection (the op table: once per case): decided once.
  static const std::string missing = [] {
    if (!cpu_has_avx512_bf16())
      return std::string("this CPU lacks the avx512_bf16 instructions (lscpu's flags)");
    const std::string impl = bf16_matmul_kernels();
    // oneDNN may be capped below the CPU (ONEDNN_MAX_CPU_ISA) and then emulates bf16 slowly.
    if (impl.find("bf16") == std::string::npos && impl.find("amx") == std::string::npos)
      return "oneDNN would run bf16 matmuls with " + impl + ", not native bf16 kernels "
             "(ONEDNN_MAX_CPU_ISA set below avx512_core_bf16?)";
    return std::string();
  }();
  if (!missing.empty() && why) *why = missing;
  return missing.empty();
}

}  // namespace strata::cpu
