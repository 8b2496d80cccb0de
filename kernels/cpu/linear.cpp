// Fully connected layer: each product is a single sgemm on the row-major buffers as they are,
// with the transposes folded into the gemm flags (no copies).
#include <algorithm>
#include <cstring>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

// out (B,O) = inp (B,I) @ weight (O,I)^T + bias (O)
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int I, int O) {
  float beta = 0.f;
  if (bias) {
    // Bias first, then accumulate the product into it (beta = 1): no second pass over out.
    for (int b = 0; b < B; ++b) std::memcpy(out + int64_t(b) * O, bias, sizeof(float) * O);
    beta = 1.f;
  }
  sgemm(false, true, B, O, I, 1.f, inp, I, weight, I, beta, out, O);
}

// dout (B,O), inp (B,I), weight (O,I) -> dinp (B,I), dweight (O,I), dbias (O)
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int B, int I, int O) {
  if (dinp) sgemm(false, false, B, I, O, 1.f, dout, O, weight, I, 0.f, dinp, I);
  if (dweight) sgemm(true, false, O, I, B, 1.f, dout, O, inp, I, 0.f, dweight, I);
  if (dbias) {
    // Row by row so the inner loop runs over contiguous memory and vectorises.
    std::fill(dbias, dbias + O, 0.f);
    for (int b = 0; b < B; ++b) {
      const float* d = dout + int64_t(b) * O;
      for (int o = 0; o < O; ++o) dbias[o] += d[o];
    }
  }
}

}  // namespace strata::cpu
