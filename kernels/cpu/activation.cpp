// Elementwise activations: plain loops that -O3 vectorises.
#include <cmath>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

// inp (n) -> out (n). x < 0 ? 0 : x keeps NaN (like PyTorch) and compiles to maxps.
void relu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] < 0.f ? 0.f : inp[i];
}

// dout (n), out (n) -> dinp (n). Uses the forward output, so the input need not be kept.
// dout is loaded unconditionally: with the load inside the ?: GCC keeps a branch (it may not
// add a load the source does not make), which mispredicts on random signs (~10x slower).
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = dout[i];
    dinp[i] = out[i] > 0.f ? d : 0.f;
  }
}

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2*pi)
}  // namespace

// inp (n) -> out (n); gelu(x) = x * Phi(x) = x/2 * (1 + erf(x/sqrt 2)).
void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = x * 0.5f * (1.f + std::erf(x * kInvSqrt2));
  }
}

// dout (n), inp (n) -> dinp (n); gelu'(x) = Phi(x) + x * phi(x), phi the normal density.
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

// x (rows, cols) += bias (cols) on every row.
void add_bias_rows(float* x, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + int64_t(r) * cols;
    for (int c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

}  // namespace strata::cpu
