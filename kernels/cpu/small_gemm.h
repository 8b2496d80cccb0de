// fp32 GEMMs for the small-row products of a training step (a batch of up to 64 rows against
// a layer's weight), on AVX-512, with no operand copies where a product needs none. oneDNN's
// matmul copied the transposed weight into its blocked layout at every forward call (4.7 % of
// the MLP's step on Zen 5), and its sgemm and matmul spend microseconds per call choosing and
// dispatching. Here one register tile of 6 rows x 64 columns runs over the whole K, each
// element's sum one FMA at a time from zero in k order: a fixed order, the same on every
// AVX-512 CPU (tests/ops/linear.cpp holds the kernels to it bit for bit). oneDNN's order
// depends on the cache sizes it detects: inside a strata run it summed the MLP's first layer
// (K = 784) as 512 products and 272 added after, in a plain test process on the same machine
// as one run of 784; where it ran one run, these kernels' results are bitwise its results.
#pragma once
#include "strata/kernels_cpu.h"

namespace strata::cpu {

// small_gemm, small_gemm_supported and small_transpose: strata/kernels_cpu.h.

// small_gemm with A's element (m, k) at A[row_off[m] + k_off[k]]: a convolution's input read
// in place as its im2col matrix (conv_implicit.h). Each sum in k order, then C's column n gets
// col_bias[n] (col_bias may be null).
void small_gemm_gathered(int M, int N, int K, const float* A, const int64_t* row_off,
                         const int64_t* k_off, const float* B, int64_t ldb, float* C, int64_t ldc,
                         bool accumulate, const float* col_bias);

// out (B,O) = inp (B,I) @ weight (O,I)^T [+ bias] [ReLU], as out^T = weight @ inp^T: the batch's
// rows are transposed into scratch (B*I floats, far fewer than the weight's O*I at these
// shapes) and the result transposed back with the bias and ReLU applied.
void small_linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                          int B, int I, int O, bool relu);

}  // namespace strata::cpu
