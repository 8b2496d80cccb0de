// Fully connected layer: each product is a single GEMM on the row-major buffers as they are,
// with the transposes folded into the GEMM's strides (no copies of our own, but for the weight's
// reorder in forward products of kPackedWeightMinRows rows and more). Batches of up to
// kSmallGemmMaxRows rows take small_gemm.h's kernels on AVX-512. Above that, forward products of
// at least kMatmulMinWork multiply-adds go through a oneDNN matmul primitive made for their exact
// shape, with bias and ReLU in its epilogue (no passes of their own), and so do the weight
// gradients of large weights (see use_matmul_weight_grad); the rest through sgemm.
#include <algorithm>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "small_gemm.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

// On the benchmark MLP (batch 64, one thread; before the small-row kernels took such batches)
// the matmul primitive matched or beat sgemm in forward from the 784x256 down to the 256x128
// layer and lost on the 128x10 output layer. In backward, inside a training step, sgemm was
// faster for both products (the weight gradient by ~10%: bench_step).
constexpr int64_t kMatmulMinWork = int64_t(1) << 20;

bool use_matmul(int M, int N, int K) { return int64_t(M) * N * K >= kMatmulMinWork; }

// The weight gradient dout^T @ inp (transposed A) on the GPT's shapes (2048 rows, one thread,
// best of 11 interleaved calls): sgemm 97-104 GFLOP/s against the matmul primitive's 111-133
// where the weight has at least 384 x 1536 elements (c_fc, mlp c_proj: 3-5 ms less each), a
// tie at 384 x 1152, and sgemm ahead at 384 x 384 and below (and on the MLP above). The
// input gradient dout @ weight stays on sgemm: it was faster on every GPT shape (136-155
// against 117-147 GFLOP/s).
constexpr int64_t kMatmulMinWeightGrad = int64_t(1) << 19;

bool use_matmul_weight_grad(int B, int I, int O) {
  return int64_t(O) * I >= kMatmulMinWeightGrad && use_matmul(O, I, B);
}

// Forward products of at least this many rows reorder the weight into the primitive's blocked
// layout first (matmul_packed_b), once per call; the same sums, bitwise. On the primitive's own
// path its copy of the transposed weight took 8.8 % of the GPT's c_attn forward (2048 rows:
// copied again per block of rows), the reorder 2.1 % (perf). The GPT's fp32 step (2048 rows,
// dim 384, AMD EPYC family 25, one thread): 1.04x tokens/s, the median of 7 alternating pairs
// (0.99-1.08). At 64-1024 rows the reorder cost more than it saved (0.79-1.01x; the MLP's
// forward 0.89-0.94x): oneDNN's reorder is slower than the primitive's one copy there. Keeping
// the reorder once per optimizer step would not help the MLP either, as one step runs one
// forward per weight version (benchmarks/README.md, bench_gemm).
// The packed copy lives in one scratch per thread, as large as the largest such weight: at most
// kPackedWeightMaxElems floats (16 MiB); larger weights (a GPT-2 token table, 38.6M) stay as
// they are.
constexpr int kPackedWeightMinRows = 2048;
constexpr int64_t kPackedWeightMaxElems = int64_t(1) << 22;

// Batches of up to this many rows take small_gemm.h's kernels on AVX-512, for all three
// products (bench_gemm, Zen 5, one thread: the forward 1.02-1.4x oneDNN's at 16-64 rows and
// 0.7-0.95x from 96, as its transposed product then splits the batch into blocks of 64; the
// backward products at parity, and 1.2-2.4x where a dimension is as small as the MLP's 10
// classes).
constexpr int kSmallGemmMaxRows = 64;

bool use_small_gemm(int B) { return B <= kSmallGemmMaxRows && small_gemm_supported(); }

// out (B,O) = inp @ weight^T [+ bias] [ReLU]
void forward(float* out, const float* inp, const float* weight, const float* bias, int B, int I,
             int O, bool relu) {
  if (use_small_gemm(B)) {
    small_linear_forward(out, inp, weight, bias, B, I, O, relu);
    return;
  }
  if (use_matmul(B, O, I)) {
    if (B >= kPackedWeightMinRows && int64_t(O) * I <= kPackedWeightMaxElems)
      matmul_packed_b(false, true, B, O, I, inp, I, weight, I, out, O, bias, relu);
    else
      matmul(false, true, B, O, I, inp, I, weight, I, out, O, bias, relu);
    return;
  }
  float beta = 0.f;
  if (bias) {
    // Bias first, then accumulate the product into it (beta = 1): no second pass over out.
    for (int b = 0; b < B; ++b) std::memcpy(out + int64_t(b) * O, bias, sizeof(float) * O);
    beta = 1.f;
  }
  sgemm(false, true, B, O, I, 1.f, inp, I, weight, I, beta, out, O);
  if (relu) relu_forward(out, out, int64_t(B) * O);
}

// The bias gradient's rows (dbias += each row of dout, the rows in order), and the ReLU's
// backward with it in one pass over dout (the same sums, in the same row order, as
// relu_backward followed by the bias gradient): dpre = dout where out > 0, dbias += dpre.
// Row by row so the inner loops run over contiguous memory and vectorise across columns (a
// column's sum still adds its rows in order), built for each instruction set: at SSE width
// they took 0.7 % of the MLP's step (with the ReLU) and of the fp32 GPT's (the bias alone).
#define STRATA_BIAS_GRAD_VARIANT(suffix, attr, W)                                          \
  attr void add_rows_##suffix(float* dbias, const float* dout, int B, int O) {           \
    for (int b = 0; b < B; ++b) {                                                        \
      const float* d = dout + int64_t(b) * O;                                            \
      for (int o = 0; o < O; ++o) dbias[o] += d[o];                                      \
    }                                                                                    \
  }                                                                                      \
  attr void relu_rows_##suffix(float* dpre, float* dbias, const float* dout,             \
                               const float* out, int B, int O) {                         \
    for (int b = 0; b < B; ++b) {                                                        \
      const float* d = dout + int64_t(b) * O;                                            \
      const float* y = out + int64_t(b) * O;                                             \
      float* g = dpre + int64_t(b) * O;                                                  \
      for (int o = 0; o < O; ++o) {                                                      \
        const float v = d[o]; /* loaded unconditionally: see relu_backward */            \
        g[o] = y[o] > 0.f ? v : 0.f;                                                     \
      }                                                                                  \
      if (dbias)                                                                         \
        for (int o = 0; o < O; ++o) dbias[o] += g[o];                                    \
    }                                                                                    \
  }
STRATA_ISA_VARIANTS(STRATA_BIAS_GRAD_VARIANT, "avx2")
#undef STRATA_BIAS_GRAD_VARIANT

void bias_grad(float* dbias, const float* dout, int B, int O, bool accumulate) {
  static const auto rows = pick_isa(add_rows_avx512, add_rows_avx2, add_rows_generic);
  if (!accumulate) std::fill(dbias, dbias + O, 0.f);
  rows(dbias, dout, B, O);
}

void relu_bias_grad(float* dpre, float* dbias, const float* dout, const float* out, int B, int O,
                    bool accumulate) {
  static const auto rows = pick_isa(relu_rows_avx512, relu_rows_avx2, relu_rows_generic);
  if (dbias && !accumulate) std::fill(dbias, dbias + O, 0.f);
  rows(dpre, dbias, dout, out, B, O);
}

// The two products of backward, from the gradient at the layer's output (pre-activation), and
// the bias gradient (dbias null: none).
void backward_products(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int B, int I, int O,
                       bool accumulate) {
  if (dbias) bias_grad(dbias, dout, B, O, accumulate);
  if (use_small_gemm(B)) {
    if (dinp) small_gemm(B, I, O, dout, O, 1, weight, I, dinp, I, false);
    if (dweight) small_gemm(O, I, B, dout, 1, O, inp, I, dweight, I, accumulate);
    return;
  }
  if (dinp) sgemm(false, false, B, I, O, 1.f, dout, O, weight, I, 0.f, dinp, I);
  if (!dweight) return;
  if (!use_matmul_weight_grad(B, I, O))
    sgemm(true, false, O, I, B, 1.f, dout, O, inp, I, accumulate ? 1.f : 0.f, dweight, I);
  else if (accumulate)
    matmul_accumulate(true, false, O, I, B, dout, O, inp, I, dweight, I);
  else
    matmul(true, false, O, I, B, dout, O, inp, I, dweight, I, nullptr, false);
}

// bf16 (train.precision = "bf16"): the same products on bf16 copies of their inputs, all
// through the matmul primitive (its bf16 kernels beat the fp32 ones on every shape, small ones
// included). Each A operand is rounded once per call (dout serves both backward products); each
// B operand (the weight, and inp for the weight gradient) is rounded straight into the layout
// the kernels read, in one pass where rounding and the kernels' own copy of it were two
// (matmul_bf16_rounding_b).
void forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int B,
                  int I, int O, bool relu) {
  const bf16_t* a = to_bf16_scratch(0, inp, int64_t(B) * I);
  matmul_bf16_rounding_b(false, true, B, O, I, a, I, weight, I, out, O, bias, relu, false);
}

// The two products from d, dout rounded.
void products_bf16(float* dinp, float* dweight, const bf16_t* d, const float* inp,
                   const float* weight, int B, int I, int O, bool accumulate) {
  if (dinp)
    matmul_bf16_rounding_b(false, false, B, I, O, d, O, weight, I, dinp, I, nullptr, false,
                           false);
  if (dweight)
    matmul_bf16_rounding_b(true, false, O, I, B, d, O, inp, I, dweight, I, nullptr, false,
                           accumulate);
}

void backward_products_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int B, int I, int O,
                            bool accumulate) {
  // The bias gradient in the pass that rounds dout (one read of dout, not two).
  bf16_t* d = bf16_scratch(0, size_t(int64_t(B) * O));
  if (dbias)
    to_bf16_col_sums(d, dout, B, O, dbias, accumulate);
  else
    to_bf16(d, dout, int64_t(B) * O);
  products_bf16(dinp, dweight, d, inp, weight, B, I, O, accumulate);
}

// Backward through a GELU whose derivative forward kept (grad), then the linear layer before
// it: dpre = dout * grad formed, rounded and summed into the bias gradient in one pass, not
// written back in fp32 unless asked (dpre not null) and read again.
void gelu_products_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* grad, const float* inp, const float* weight, int B, int I,
                        int O, float* dpre, bool accumulate) {
  bf16_t* d = bf16_scratch(0, size_t(int64_t(B) * O));
  to_bf16_col_sums(d, dout, B, O, dbias, accumulate, grad, dpre);
  products_bf16(dinp, dweight, d, inp, weight, B, I, O, accumulate);
}

// fp32: dpre formed (in the thread's scratch where the caller does not want it), then the
// products read it as linear_backward does.
void gelu_products(float* dinp, float* dweight, float* dbias, const float* dout,
                   const float* grad, const float* inp, const float* weight, int B, int I, int O,
                   float* dpre, bool accumulate) {
  thread_local std::vector<float> scratch;
  if (!dpre) {
    scratch.resize(size_t(int64_t(B) * O));
    dpre = scratch.data();
  }
  gelu_backward_kept(dpre, dout, grad, int64_t(B) * O);
  backward_products(dinp, dweight, dbias, dpre, inp, weight, B, I, O, accumulate);
}

}  // namespace

// The entry points in one precision, written once and expanded for each: FORWARD, PRODUCTS and
// GELU_PRODUCTS are forward/backward_products/gelu_products (fp32: sgemm or the matmul
// primitive) or their _bf16 versions (bf16 copies of the operands, the bias gradient summed as
// dout is rounded); the bias and ReLU gradients are fp32 in both.
//   linear_forward:  out (B,O) = inp (B,I) @ weight (O,I)^T + bias (O)
//   linear_backward: dout (B,O), inp (B,I), weight (O,I) -> dinp (B,I), dweight (O,I), dbias (O)
#define STRATA_LINEAR_ENTRY_POINTS(FORWARD, PRODUCTS, GELU_PRODUCTS)                           \
  void linear_forward(float* out, const float* inp, const float* weight, const float* bias,  \
                      int B, int I, int O) {                                                 \
    FORWARD(out, inp, weight, bias, B, I, O, false);                                         \
  }                                                                                          \
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,         \
                       const float* inp, const float* weight, int B, int I, int O,           \
                       bool accumulate) {                                                    \
    PRODUCTS(dinp, dweight, dbias, dout, inp, weight, B, I, O, accumulate);                  \
  }                                                                                          \
  void linear_relu_forward(float* out, const float* inp, const float* weight,                \
                           const float* bias, int B, int I, int O) {                         \
    FORWARD(out, inp, weight, bias, B, I, O, true);                                          \
  }                                                                                          \
  void linear_relu_backward(float* dinp, float* dweight, float* dbias, const float* dout,    \
                            const float* out, const float* inp, const float* weight, int B,  \
                            int I, int O, float* dpre, bool accumulate) {                    \
    relu_bias_grad(dpre, dbias, dout, out, B, O, accumulate);                                \
    PRODUCTS(dinp, dweight, nullptr, dpre, inp, weight, B, I, O, accumulate);                \
  }                                                                                          \
  void linear_gelu_backward(float* dinp, float* dweight, float* dbias, const float* dout,    \
                            const float* grad, const float* inp, const float* weight, int B, \
                            int I, int O, float* dpre, bool accumulate) {                    \
    GELU_PRODUCTS(dinp, dweight, dbias, dout, grad, inp, weight, B, I, O, dpre, accumulate); \
  }

STRATA_LINEAR_ENTRY_POINTS(forward, backward_products, gelu_products)

namespace bf16 {
STRATA_LINEAR_ENTRY_POINTS(forward_bf16, backward_products_bf16, gelu_products_bf16)
}  // namespace bf16

#undef STRATA_LINEAR_ENTRY_POINTS
}  // namespace strata::cpu
