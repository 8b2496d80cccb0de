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
// Columns [c0, c1) of to_bf16_col_sums: per row, each 16 columns rounded and added to their
// sums (kept in `sums`, in L1 beside the row), so each column adds its rows in order.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_col_sums(
    bf16_t* dst, const float* src, int rows, int cols, int c0, int c1, float* sums) {
  for (int r = 0; r < rows; ++r) {
    const float* x = src + int64_t(r) * cols;
    bf16_t* y = dst + int64_t(r) * cols;
    for (int c = c0; c < c1; c += 16) {
      const __mmask16 m = c + 16 <= c1 ? __mmask16(0xffff) : __mmask16((1u << (c1 - c)) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(m, x + c);
      const __m256bh h = _mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(y + c, m, reinterpret_cast<const __m256i&>(h));
      _mm512_mask_storeu_ps(sums + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, sums + c), v));
    }
  }
}
}  // namespace
#endif

void to_bf16_col_sums(bf16_t* dst, const float* src, int rows, int cols, float* sums,
                      bool accumulate) {
  if (!accumulate) std::fill(sums, sums + cols, 0.f);
#if defined(__x86_64__)
  // Threads split the columns, never a column's rows: its sum keeps the rows' order.
  constexpr int kCols = 256;
  const int pieces = (cols + kCols - 1) / kCols;
  if (pieces > 1 && int64_t(rows) * cols >= (int64_t(1) << 16) && omp_get_max_threads() > 1 &&
      !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int p = 0; p < pieces; ++p)
      round_col_sums(dst, src, rows, cols, p * kCols, std::min(cols, (p + 1) * kCols), sums);
    return;
  }
  round_col_sums(dst, src, rows, cols, 0, cols, sums);
#else
  (void)dst, (void)src, (void)rows;
#endif
}

bf16_t* bf16_scratch(int slot, size_t n) {
  thread_local std::vector<bf16_t> bufs[kBf16ScratchSlots];
  std::vector<bf16_t>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
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
