// uint8 pixels to float in [0, 1]: the loader's conversion of image batches (kernels_cpu.h).
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

// dst[i] = src[i] / 255 in float, correctly rounded: the reference.
void u8_to_unit_float_div(float* dst, const unsigned char* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float(src[i]) / 255.0f;
}

#if defined(__x86_64__)
// The same bits without a division (in memory mode a batch is converted on the training
// thread, and divps made this 15 us of a 64-row batch): q = x * (1/255) is off by an ulp for
// about half of the 256 values; one FMA step, q + (x - 255 q) / 255 with the exact residual
// x - 255 q, rounds every one of them as the division does (checked for all 256 at first use).
__attribute__((target("avx512f"))) void u8_to_unit_float_fma(float* dst, const unsigned char* src,
                                                             int64_t n) {
  const __m512 c = _mm512_set1_ps(1.0f / 255.0f), k = _mm512_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    // (maskz forms: GCC 12 warns about the "undefined" pass-through of the plain ones)
    const __m512 x = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepu8_epi32(0xFFFF, b));
    const __m512 q = _mm512_mul_ps(x, c);
    const __m512 r = _mm512_fnmadd_ps(q, k, x);  // x - q*255, exact
    _mm512_storeu_ps(dst + i, _mm512_fmadd_ps(r, c, q));
  }
  u8_to_unit_float_div(dst + i, src + i, n - i);
}

// True if the FMA version gives the division's bits for every byte value on this CPU.
bool fma_conversion_exact() {
  if (!__builtin_cpu_supports("avx512f")) return false;
  unsigned char all[256];
  float a[256], b[256];
  for (int v = 0; v < 256; ++v) all[v] = static_cast<unsigned char>(v);
  u8_to_unit_float_div(a, all, 256);
  u8_to_unit_float_fma(b, all, 256);
  return std::memcmp(a, b, sizeof a) == 0;
}
#endif

}  // namespace

// dst[i] = src[i] / 255 (uint8 pixels to [0, 1]), bitwise as the division.
void u8_to_unit_float(float* dst, const unsigned char* src, int64_t n) {
#if defined(__x86_64__)
  static const bool fma_ok = fma_conversion_exact();
  if (fma_ok) return u8_to_unit_float_fma(dst, src, n);
#endif
  u8_to_unit_float_div(dst, src, n);
}

}  // namespace strata::cpu
