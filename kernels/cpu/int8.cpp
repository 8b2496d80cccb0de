// int8 inference for linear layers (strata quantize): weights int8 per output channel,
// activations quantized per row (or with a calibrated static scale), products summed exactly
// in int32 by oneDNN's u8 x s8 matmul (VNNI's vpdpbusd where the CPU has it), then scaled back
// to fp32 with the bias (and ReLU) in one pass.
//
// Activations go in as unsigned bytes, xq + 128: VNNI multiplies u8 by s8, and oneDNN's own s8
// x s8 path adds that shift and its correction itself, 1.0-1.3x slower (measured on the
// MLP's and GPT's shapes). The correction here is 128 * col_sum[o], subtracted in the pass that
// scales the output.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

// Row of n floats -> bytes round(x / s) + 128, saturated to [1, 255] (symmetric: -127..127).
void quantize_row_scalar(uint8_t* dst, const float* x, int n, float inv) {
  for (int i = 0; i < n; ++i) {
    const float v = std::clamp(std::nearbyint(x[i] * inv), -127.f, 127.f);
    dst[i] = uint8_t(int(v) + 128);
  }
}

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized on their own undefined-vector
// arguments (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw"))) void quantize_row_avx512(uint8_t* dst, const float* x,
                                                                      int n, float inv) {
  const __m512 s = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  const __m512i shift = _mm512_set1_epi32(128);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    // Round to nearest even (the default MXCSR mode), as std::nearbyint.
    const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), lo), hi);
    const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), shift);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtusepi32_epi8(q));
  }
  quantize_row_scalar(dst + i, x + i, n - i, inv);
}

__attribute__((target("avx512f"))) void quantize_scaled_avx512(int8_t* dst, const float* x,
                                                              const float* inv, int64_t n) {
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_min_ps(
        _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(inv + i)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  for (; i < n; ++i) dst[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv[i]), -127.f, 127.f));
}
#pragma GCC diagnostic pop
#endif

using QuantizeRow = void (*)(uint8_t*, const float*, int, float);
QuantizeRow pick_quantize_row() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return quantize_row_avx512;
#endif
  return quantize_row_scalar;
}

float max_abs(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
  return m;
}

template <class T>
T* thread_buffer(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

void quantize_scaled(int8_t* dst, const float* x, const float* inv_scale, int64_t n) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return quantize_scaled_avx512(dst, x, inv_scale, n);
#endif
  for (int64_t i = 0; i < n; ++i)
    dst[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv_scale[i]), -127.f, 127.f));
}

void quantize_rows(int8_t* q, float* scale, int32_t* col_sum, const float* w, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* wr = w + int64_t(r) * cols;
    const float m = max_abs(wr, cols);
    const float s = m > 0 ? m / 127.f : 1.f;
    int32_t sum = 0;
    for (int c = 0; c < cols; ++c) {
      const int v = int(std::clamp(std::nearbyint(wr[c] / s), -127.f, 127.f));
      q[int64_t(r) * cols + c] = int8_t(v);
      sum += v;
    }
    scale[r] = s;
    col_sum[r] = sum;
  }
}

void linear_int8_forward(float* out, const float* inp, const Int8Matrix& w, const float* bias,
                         int B, int I, int O, bool relu) {
  if (B <= 0 || O <= 0) return;
  static const QuantizeRow quantize_row = pick_quantize_row();
  uint8_t* xq = thread_buffer<uint8_t>(size_t(B) * I);
  float* row_scale = thread_buffer<float>(size_t(B));
  for (int b = 0; b < B; ++b) {
    const float* x = inp + int64_t(b) * I;
    float s = w.act_scale;
    if (s <= 0) {
      const float m = max_abs(x, I);
      s = m > 0 ? m / 127.f : 1.f;
    }
    row_scale[b] = s;
    quantize_row(xq + int64_t(b) * I, x, I, 1.f / s);
  }
  int32_t* acc = thread_buffer<int32_t>(size_t(B) * O);
  matmul_u8s8(B, O, I, xq, I, w.q, I, acc, O);
  for (int b = 0; b < B; ++b) {
    const int32_t* a = acc + int64_t(b) * O;
    float* y = out + int64_t(b) * O;
    const float rs = row_scale[b];
    for (int o = 0; o < O; ++o) {
      float v = float(a[o] - 128 * w.col_sum[o]) * (rs * w.scale[o]) + (bias ? bias[o] : 0.f);
      y[o] = relu && v < 0.f ? 0.f : v;
    }
  }
}

}  // namespace strata::cpu
