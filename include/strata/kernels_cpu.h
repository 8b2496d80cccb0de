// The fp32 CPU kernels: the reference every other backend is checked against.
// kernels/cpu/<family>.cpp, forward and backward of an op side by side. The ops of
// strata/ops.def (their contracts are written there) are declared here from that list; the
// rest of this header is what only the CPU has: the GEMM entry points the CPU layers and
// kernels share, and the scalar references the tests check the vectorised kernels against.
#pragma once
#include <cstdint>

#include "strata/ops.h"

namespace strata::cpu {

using strata::Conv2dShape;

#define STRATA_OP(name, ret, params) ret name params;
#include "strata/ops.def"

// ---- BLAS (kernels/cpu/gemm.cpp) -------------------------------------------------------
// GEMMs run on oneDNN's JIT sgemm (see gemm.cpp for why). blas_init sets the math thread
// count; safe to call more than once.
void blas_init(int threads);
const char* blas_corename();  // the kernels in use, e.g. "oneDNN avx512_core"
// C(M,N) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is (M,K), op(B) is (K,N).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);
// C(M,N) = op(A) * op(B) [+ bias(N) on every row] [then ReLU], row-major, through a oneDNN
// matmul primitive made for this exact shape (cached per thread). Faster than sgemm on the
// larger linear-layer shapes, and bias and ReLU cost no extra pass. bias may be null.
void matmul(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
            const float* B, int ldb, float* C, int ldc, const float* bias, bool relu);
// C(M,N) += op(A) * op(B), row-major, through a matmul primitive with a sum post-op (the
// accumulating weight gradients of micro-batches).
void matmul_accumulate(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                       const float* B, int ldb, float* C, int ldc);

// ---- Activations (kernels/cpu/activation.cpp) -----------------------------------------
// gelu_forward/backward run on W lanes at once (AVX-512, AVX2 or SSE, picked at run time) with
// a branch-free erfc: within ~2e-7 * max(1, |x|) of these scalar std::erf / std::exp forms,
// one libm call per element, which are the tests' reference (activation.cpp says why and how).
void gelu_forward_reference(float* out, const float* inp, int64_t n);
void gelu_backward_reference(float* dinp, const float* dout, const float* inp, int64_t n);
// out += bias over rows: x (rows, cols), bias (cols).
void add_bias_rows(float* x, const float* bias, int rows, int cols);

// ---- Conversion (kernels/cpu/convert.cpp) ----------------------------------------------
// dst[i] = src[i] / 255 (uint8 pixels to [0, 1]), bitwise as the division (the loader's).
void u8_to_unit_float(float* dst, const unsigned char* src, int64_t n);

// The transformer's kernels split their work over OpenMP threads (blas_init sets the count)
// and give bitwise the same results for any thread count: every sum runs in an order fixed
// by the shapes (and, for the row sums of layernorm and softmax, by the machine's vector
// width: AVX-512, AVX2 or SSE). attention_backward keeps the gradient of att in a per-thread
// scratch of 64*T floats.

}  // namespace strata::cpu
