// Fully connected layer on cuBLAS. Every product is one GEMM on the row-major buffers as they
// are: a row-major X (r, c) is the column-major X^T, so row-major C = op(A) op(B) is computed
// as column-major C^T = op(B)^T op(A)^T (operands swapped, no copies).
//
// GEMMs go through cuBLASLt, with bias and ReLU in its epilogue (no passes of their own); an
// algorithm is chosen once per (shape, alignment, epilogue, precision) by cuBLASLt's heuristic
// and cached. Where cuBLASLt has none (or STRATA_CUBLASLT=0) the GEMM runs on cublasGemmEx
// and bias/ReLU on bias_act_rows_kernel.
// Precision: fp32 = CUBLAS_COMPUTE_32F (strict fp32, no TF32); bf16 = fp32 storage with
// CUBLAS_COMPUTE_32F_FAST_16BF (inputs rounded to bf16 on the tensor cores, fp32 accumulation
// and output). The bias gradient is always an fp32 reduction of its own (bias_grad_*).
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// ---- Epilogue kernels ------------------------------------------------------------------

// C (rows, cols; leading dimension ldc) = act((overwrite ? 0 : C) + bias (cols)).
// bias may be null. ReLU is x < 0 ? 0 : x (keeps NaN), as the CPU's relu_forward.
template <typename I>
__global__ void bias_act_rows_kernel(float* c, const float* bias, I rows, I cols, I ldc,
                                     bool relu, bool overwrite) {
  STRATA_GRID_STRIDE_T(I, i, rows * cols) {
    const I r = i / cols, col = i - r * cols;
    float* x = c + int64_t(r) * ldc + col;
    float v = overwrite ? 0.f : *x;
    if (bias) v += bias[col];
    *x = relu && v < 0.f ? 0.f : v;
  }
}

void bias_act_rows(float* c, const float* bias, int rows, int cols, int ldc, bool relu,
                   bool overwrite) {
  const int64_t n = int64_t(rows) * cols;
  if (n == 0) return;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    bias_act_rows_kernel<I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        c, bias, I(rows), I(cols), I(ldc), relu, overwrite);
  });
  STRATA_CUDA_LAUNCHED();
}

// ---- cuBLASLt plans --------------------------------------------------------------------

// The largest power of two (<= 256) that divides the address: cuBLASLt's heuristic must only
// offer kernels that work at the alignment the buffers actually have (a parameter inside a
// flat buffer may be only 4-byte aligned).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

struct LtKey {
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;
  int epilogue;
  bool bf16;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(ta, tb, M, N, K, lda, ldb, ldc, epilogue, bf16, align_a, align_b, align_c);
  }
  bool operator<(const LtKey& o) const { return tie() < o.tie(); }
};

struct LtPlan {
  bool ok = false;  // false: cuBLASLt has no algorithm for this key (use cublasGemmEx)
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // column-major operands
  cublasLtMatmulAlgo_t algo{};
};

std::mutex g_lt_mutex;
std::map<LtKey, LtPlan> g_lt_plans;  // lives until exit (see context.cu)

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  STRATA_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  STRATA_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
}

// Column-major problem: D^T (N, M) = opA'(A' = row-major B) @ opB'(B' = row-major A).
LtPlan make_lt_plan(const LtKey& k) {
  Context& cx = ctx();
  LtPlan p;
  const cublasComputeType_t compute = k.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  STRATA_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t op_a = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(k.epilogue));
  // Stored shapes, column-major: row-major B is (K,N) -> (N rows, K cols), or (N,K) when
  // transposed -> (K rows, N cols); likewise A; C (M,N) row-major -> (N rows, M cols).
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, k.tb ? k.K : k.N,
                                               k.tb ? k.N : k.K, k.ldb));
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, k.ta ? k.M : k.K,
                                               k.ta ? k.K : k.M, k.lda));
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, k.N, k.M, k.ldc));

  cublasLtMatmulPreference_t pref;
  STRATA_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(cx.lt_workspace_bytes));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);  // A' is row-major B
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cx.lt, p.desc, p.a, p.b, p.c, p.c,
                                                           pref, 1, &result, &found);
  STRATA_CUDA_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = result.algo;
    p.ok = true;
    return p;
  }
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
    STRATA_CUDA_CHECK(st);  // a real error, not "no algorithm"
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutDestroy(p.a));
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutDestroy(p.b));
  STRATA_CUDA_CHECK(cublasLtMatrixLayoutDestroy(p.c));
  STRATA_CUDA_CHECK(cublasLtMatmulDescDestroy(p.desc));
  return LtPlan{};
}

// One cuBLASLt matmul; false when cuBLASLt has no algorithm for it.
bool lt_gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
             int ldb, float beta, float* C, int ldc, const float* bias, bool relu) {
  Context& cx = ctx();
  const cublasLtEpilogue_t epi = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                      : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  const LtKey key{ta,  tb,  M,   N,         K,       lda, ldb, ldc, int(epi), cx.bf16,
                  alignment_of(A), alignment_of(B), alignment_of(C)};
  std::lock_guard lock(g_lt_mutex);
  auto it = g_lt_plans.find(key);
  if (it == g_lt_plans.end()) it = g_lt_plans.emplace(key, make_lt_plan(key)).first;
  LtPlan& p = it->second;
  if (!p.ok) return false;
  // The descriptor is read when cublasLtMatmul is called, so a cached one can take this
  // call's bias pointer.
  if (bias) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.f;
  const cublasStatus_t st =
      cublasLtMatmul(cx.lt, p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                     cx.lt_workspace, cx.lt_workspace_bytes, cx.stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic's algorithm refused these operands after all: never ask again. The plan's
    // descriptors are kept (harmless) rather than destroyed under a possible later use.
    p.ok = false;
    return false;
  }
  STRATA_CUDA_CHECK(st);
  return true;
}

// Row-major C (M,N) = op(A) (M,K) @ op(B) (K,N) + beta*C, then + bias (N) on every row, then
// ReLU; beta is 0 or 1, bias may be null. Same conventions as cpu::sgemm.
void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, const float* bias, bool relu) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // An empty sum: C = beta*C (+ bias, ReLU). cuBLASLt does not take k = 0.
    if (beta == 0.f || bias || relu) bias_act_rows(C, bias, M, N, ldc, relu, beta == 0.f);
    return;
  }
  Context& cx = ctx();
  if (cx.use_lt) {
    // The bias epilogue is asked for only with a 16-byte aligned bias vector (cuBLASLt states
    // no alignment for it; vectorised epilogues may assume one).
    const bool fuse = !bias || alignment_of(bias) >= 16;
    if (fuse && lt_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias, relu)) return;
    if (lt_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, nullptr, false)) {
      if (bias || relu) bias_act_rows(C, bias, M, N, ldc, relu, false);
      return;
    }
  }
  const float alpha = 1.f;
  const cublasComputeType_t compute = cx.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  STRATA_CUDA_CHECK(cublasGemmEx(cx.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F,
                                 ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, compute,
                                 CUBLAS_GEMM_DEFAULT));
  if (bias || relu) bias_act_rows(C, bias, M, N, ldc, relu, false);
}

// ---- Bias gradient ---------------------------------------------------------------------
// dbias (O) (+)= column sums of g (B,O), where g = dout, or, with `out` given, the ReLU's
// backward out > 0 ? dout : 0, which is also written to dpre (one pass over dout).
// Two deterministic passes: blocks of 32 columns x 8 row lanes sum a chunk of rows each into
// partial (chunks, O); then each column adds its chunk sums in chunk order. With one chunk the
// first pass writes dbias itself.
constexpr int kBiasCols = 32, kBiasLanes = 8;

__global__ void bias_grad_partial_kernel(float* partial, float* dbias, float* dpre,
                                         const float* dout, const float* out, int B, int O,
                                         int rows_per_chunk, bool accumulate) {
  __shared__ float sums[kBiasLanes][kBiasCols + 1];
  const int col = blockIdx.x * kBiasCols + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(B, r0 + rows_per_chunk);
  float s = 0.f;
  if (col < O) {
    for (int r = r0 + threadIdx.y; r < r1; r += kBiasLanes) {
      const int64_t i = int64_t(r) * O + col;
      float g = dout[i];
      if (out) {
        g = out[i] > 0.f ? g : 0.f;
        dpre[i] = g;
      }
      s += g;
    }
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < O) {
    float t = 0.f;
    for (int l = 0; l < kBiasLanes; ++l) t += sums[l][threadIdx.x];
    if (gridDim.y == 1)
      dbias[col] = accumulate ? dbias[col] + t : t;
    else
      partial[int64_t(blockIdx.y) * O + col] = t;
  }
}

__global__ void bias_grad_final_kernel(float* dbias, const float* partial, int chunks, int O,
                                       bool accumulate) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= O) return;
  float t = 0.f;
  for (int c = 0; c < chunks; ++c) t += partial[int64_t(c) * O + col];
  dbias[col] = accumulate ? dbias[col] + t : t;
}

// The ReLU's backward alone (no bias gradient wanted): dpre = out > 0 ? dout : 0.
__global__ void relu_mask_kernel(float* dpre, const float* dout, const float* out, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float d = dout[i];
    dpre[i] = out[i] > 0.f ? d : 0.f;
  }
}

// dout (B,O) [, out (B,O) -> dpre (B,O)] -> dbias (O); dbias may be null when out is given.
void bias_grad(float* dbias, float* dpre, const float* dout, const float* out, int B, int O,
               bool accumulate) {
  if (O <= 0) return;
  Context& cx = ctx();
  if (!dbias) {
    const int64_t n = int64_t(B) * O;
    if (n == 0) return;
    relu_mask_kernel<<<blocks_for(n), kThreads, 0, cx.stream>>>(dpre, dout, out, n);
    STRATA_CUDA_LAUNCHED();
    return;
  }
  const int col_blocks = (O + kBiasCols - 1) / kBiasCols;
  // Enough chunks for ~2 blocks per SM, each chunk at least 256 rows (32 per thread).
  const int max_chunks = std::max(1, B / 256);
  const int chunks = std::clamp((2 * cx.sm_count + col_blocks - 1) / col_blocks, 1, max_chunks);
  const int rows_per_chunk = std::max(1, (B + chunks - 1) / chunks);
  float* partial =
      chunks > 1 ? static_cast<float*>(reduce_scratch(sizeof(float) * size_t(chunks) * O)) : nullptr;
  const dim3 grid(col_blocks, chunks), block(kBiasCols, kBiasLanes);
  bias_grad_partial_kernel<<<grid, block, 0, cx.stream>>>(partial, dbias, dpre, dout, out, B, O,
                                                          rows_per_chunk, accumulate);
  STRATA_CUDA_LAUNCHED();
  if (chunks > 1) {
    bias_grad_final_kernel<<<(O + 255) / 256, 256, 0, cx.stream>>>(dbias, partial, chunks, O,
                                                                   accumulate);
    STRATA_CUDA_LAUNCHED();
  }
}

// The two products of backward, from the gradient g (B,O) at the layer's output.
void backward_products(float* dinp, float* dweight, const float* g, const float* inp,
                       const float* weight, int B, int I, int O, bool accumulate) {
  // dinp (B,I) = g (B,O) @ weight (O,I)
  if (dinp) gemm(false, false, B, I, O, g, O, weight, I, 0.f, dinp, I, nullptr, false);
  // dweight (O,I) (+)= g^T (O,B) @ inp (B,I)
  if (dweight)
    gemm(true, false, O, I, B, g, O, inp, I, accumulate ? 1.f : 0.f, dweight, I, nullptr, false);
}

}  // namespace

// out (B,O) = inp (B,I) @ weight (O,I)^T + bias (O)
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int I, int O) {
  gemm(false, true, B, O, I, inp, I, weight, I, 0.f, out, O, bias, false);
}

// dout (B,O), inp (B,I), weight (O,I) -> dinp (B,I), dweight (O,I), dbias (O)
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int B, int I, int O, bool accumulate) {
  if (dbias) bias_grad(dbias, nullptr, dout, nullptr, B, O, accumulate);
  backward_products(dinp, dweight, dout, inp, weight, B, I, O, accumulate);
}

// out (B,O) = relu(inp (B,I) @ weight (O,I)^T + bias (O))
void linear_relu_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int I, int O) {
  gemm(false, true, B, O, I, inp, I, weight, I, 0.f, out, O, bias, true);
}

// dout (B,O) at the ReLU's output, out (B,O) that output -> dpre (B,O) (scratch: the gradient
// before the ReLU), then dinp, dweight, dbias as linear_backward.
void linear_relu_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* out, const float* inp, const float* weight, int B, int I,
                          int O, float* dpre, bool accumulate) {
  bias_grad(dbias, dpre, dout, out, B, O, accumulate);
  backward_products(dinp, dweight, dpre, inp, weight, B, I, O, accumulate);
}

}  // namespace strata::cuda
