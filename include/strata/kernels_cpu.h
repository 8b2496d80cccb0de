// The fp32 CPU kernels: the reference every other backend is checked against.
// kernels/cpu/<family>.cpp, forward and backward of an op side by side. The ops of
// strata/ops.def (their contracts are written there) are declared here from that list; the
// rest of this header is what only the CPU has: the GEMM entry points the CPU layers and
// kernels share, and the scalar references the tests check the vectorised kernels against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

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
// matmul, with B first reordered into the blocked layout the primitive's kernels read (one
// reorder of B per call into a per-thread scratch as large as the largest such B, nothing
// cached: B may change between calls). The same sums in the same order as matmul, bitwise;
// faster where many rows of A share B (the primitive otherwise copies B's blocks again for each
// block of rows: kernels/cpu/linear.cpp says where).
void matmul_packed_b(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                     const float* B, int ldb, float* C, int ldc, const float* bias, bool relu);
// C(M,N) += op(A) * op(B), row-major, through a matmul primitive with a sum post-op (the
// accumulating weight gradients of micro-batches).
void matmul_accumulate(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                       const float* B, int ldb, float* C, int ldc);

// ---- Small-row fp32 GEMMs (kernels/cpu/small_gemm.cpp: why, and where the ops use them) -----
// Whether this CPU runs them (AVX-512F); the two below throw std::logic_error where not.
bool small_gemm_supported();
// C (M,N) = sum over k of a(m,k) * B(k,n) [+ C, added after the sum when accumulate], where
// a(m,k) = A[m*a_row + k*a_col] (A row-major: a_row = lda, a_col = 1; transposed: a_row = 1,
// a_col = lda) and B, C row-major with leading dimensions ldb, ldc. Each element's products are
// added one FMA at a time from zero, in k order.
void small_gemm(int M, int N, int K, const float* A, int64_t a_row, int64_t a_col,
                const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
// dst (cols, rows; leading dimension ldd) = src (rows, cols; lds)^T.
void small_transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd);

// ---- bf16 (kernels/cpu/bf16.cpp, gemm.cpp) ---------------------------------------------
// train.precision = "bf16" on the CPU: the GEMMs of linear layers, convolutions and the
// attention's products read bf16 copies of their inputs (rounded to nearest even) and
// accumulate and write fp32; everything else (weights, gradients, optimizer state, activations
// kept for backward, softmax, LayerNorm, GELU) stays fp32.
using bf16_t = uint16_t;  // a bf16's bits: the upper half of the fp32 it rounds
// Whether bf16 GEMMs run natively here (AVX512_BF16 or AMX, and oneDNN using them); else
// *why says what is missing.
bool bf16_supported(std::string* why);
std::string bf16_matmul_kernels();  // oneDNN's bf16 matmul implementation, "brg:avx512_core_bf16"
// dst[i] = src[i] rounded to bf16 (the CPU's VCVTNEPS2BF16; needs AVX512_BF16).
void to_bf16(bf16_t* dst, const float* src, int64_t n);
// dst row r = src row r (cols floats) * scale, rounded to bf16; row strides ldd and lds. On the
// calling thread only (a kernel's per-head operands, inside its own parallel loop).
void to_bf16_rows(bf16_t* dst, int64_t ldd, const float* src, int64_t lds, int rows, int cols,
                  float scale);
// to_bf16 of src (rows, cols), and sums[c] = (accumulate ? sums[c] : 0) + src[0][c] + src[1][c]
// + ..., the rows added in order (bitwise a row-by-row loop's sums): a linear layer's bias
// gradient in the pass that rounds its output gradient (sums null: none). With `scale`, src
// times scale element by element in src's place, stored to `prod` where that is not null (a
// GELU's backward, dout times its kept derivative, in the same pass).
void to_bf16_col_sums(bf16_t* dst, const float* src, int rows, int cols, float* sums,
                      bool accumulate, const float* scale = nullptr, float* prod = nullptr);
// B (K, N) rounded to bf16 into the blocked layout oneDNN's bf16 brgemm kernels read B in
// (BA16a64b2a: K padded to 32 and N to 64 with zeros; packed_b_elems(K, N) bf16s): from B
// row-major (K, N), or with trans from B^T row-major (N, K) (a linear layer's weight as its
// forward reads it). One pass where rounding and the matmul's own copy of B were two.
int64_t packed_b_elems(int K, int N);
void to_bf16_packed_b(bf16_t* dst, const float* B, int64_t ldb, bool trans, int K, int N);
// At least n bf16 of the calling thread's buffer `slot` (< kBf16ScratchSlots), kept between
// calls: an op's bf16 copies of its GEMM operands.
constexpr int kBf16ScratchSlots = 4;  // the last: matmul_bf16_rounding_b's
bf16_t* bf16_scratch(int slot, size_t n);
// x (n) rounded into the calling thread's buffer `slot` (bf16_scratch), which it returns.
const bf16_t* to_bf16_scratch(int slot, const float* x, int64_t n);
// matmul with bf16 A and B (layouts as matmul's), fp32 accumulation, C (+ bias, ReLU) in fp32;
// accumulate adds the product to C.
void matmul_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16_t* A, int lda,
                 const bf16_t* B, int ldb, float* C, int ldc, const float* bias, bool relu,
                 bool accumulate);
// matmul_bf16 with B given in fp32 (layout as matmul's): rounded straight into the layout the
// kernels read (to_bf16_packed_b) where that is the one oneDNN chose, else rounded as it is.
// With dense operands (leading dimensions their rows' lengths, as the ops pass them) the same
// results, bitwise, as rounding B and calling matmul_bf16: the same brgemm kernels (oneDNN 2.6
// runs other kernels, summing otherwise, on strided ones).
void matmul_bf16_rounding_b(bool trans_a, bool trans_b, int M, int N, int K, const bf16_t* A,
                            int lda, const float* B, int ldb, float* C, int ldc, const float* bias,
                            bool relu, bool accumulate);

// ---- int8 (kernels/cpu/int8.cpp, gemm.cpp) ---------------------------------------------
// C (M,N) int32 = A (M,K) u8 @ B^T, B (N,K) s8 row-major: oneDNN's int8 matmul (VNNI where
// the CPU has it).
void matmul_u8s8(int M, int N, int K, const uint8_t* A, int lda, const int8_t* B, int ldb,
                 int32_t* C, int ldc);
// C (M,N) int32 = A (M,K) s8 @ B (K,N) s8, both row-major (a convolution: weights @ columns).
void matmul_s8s8(int M, int N, int K, const int8_t* A, int lda, const int8_t* B, int ldb,
                 int32_t* C, int ldc);
std::string int8_matmul_kernels();  // oneDNN's int8 matmul implementation, "brg:avx512_core_vnni"
// dst[i] = round(x[i] * inv_scale[i]) saturated to [-127, 127] (per-element scales: a row of
// convolution columns, each column its own).
void quantize_scaled(int8_t* dst, const float* x, const float* inv_scale, int64_t n);
// Symmetric per-row int8 of w (rows, cols): q = round(w / scale[r]), scale[r] = max|w[r]| / 127
// (1 for a zero row), col_sum[r] = sum of row r of q.
void quantize_rows(int8_t* q, float* scale, int32_t* col_sum, const float* w, int rows, int cols);

// The CPU's bf16 versions of the precision ops (ops.h's STRATA_PRECISION_OPS and
// STRATA_CPU_PRECISION_OPS), with the fp32 ops' signatures: cpu_backend(Precision::bf16) holds
// them.
namespace bf16 {
#define STRATA_DECLARE_BF16(name) decltype(strata::cpu::name) name;
STRATA_PRECISION_OPS(STRATA_DECLARE_BF16)
STRATA_CPU_PRECISION_OPS(STRATA_DECLARE_BF16)
#undef STRATA_DECLARE_BF16
}  // namespace bf16

// ---- Activations (kernels/cpu/activation.cpp) -----------------------------------------
// gelu_forward/backward run on W lanes at once (AVX-512, AVX2 or SSE, picked at run time) with
// a branch-free erfc: within ~2e-7 * max(1, |x|) of these scalar std::erf / std::exp forms,
// one libm call per element, which are the tests' reference (activation.cpp says why and how).
void gelu_forward_reference(float* out, const float* inp, int64_t n);
void gelu_backward_reference(float* dinp, const float* dout, const float* inp, int64_t n);
// dinp = dout * grad, grad as gelu_forward_grad wrote it: gelu_backward's result, bitwise.
void gelu_backward_kept(float* dinp, const float* dout, const float* grad, int64_t n);
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
