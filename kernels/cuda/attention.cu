// Causal multi-head self-attention on GPT-2's packed qkv (B,T,3C), forward and backward, with
// the contracts of kernels/cpu/attention.cpp (att (B,NH,T,T) is written by forward and read by
// backward, zeros above the diagonal included).
//
// The products are cuBLAS strided-batched GEMMs over the B*NH (batch, head) pairs. For uniform
// strides the heads are first copied out of the packed layout into (B,NH,T,hs) blocks (q, k,
// v; and dout in backward), and the results copied back (out; dq, dk, dv into dqkv): a few
// passes over B*T*C floats beside GEMMs of B*NH*T*T*hs multiply-adds. The score and value
// products run over the full T x T square (the zeros above the diagonal add nothing); the
// softmax, forward and backward, is strata's own kernel, one warp per row, fp32, the row
// maximum subtracted, expf (IEEE-accurate to 2 ulp) on the keys t2 <= t1 only.
// Precision: the GEMMs follow the backend's setting as the linear layers do: strict fp32
// (CUBLAS_COMPUTE_32F, no TF32), or bf16 tensor cores with fp32 accumulation
// (CUBLAS_COMPUTE_32F_FAST_16BF). Every sum runs in an order fixed by the shapes: results
// repeat bit for bit on the same GPU and library.
//
// Workspace: forward 4*B*T*C floats, backward 7*B*T*C + B*NH*T*T (the gradient of the scores),
// a device buffer of this file kept between calls and grown when a call needs more.
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// ---- Workspace -------------------------------------------------------------------------
std::mutex g_ws_mutex;
void* g_ws = nullptr;
size_t g_ws_bytes = 0;

float* workspace(size_t floats) {
  ctx();
  std::lock_guard lock(g_ws_mutex);
  const size_t bytes = floats * sizeof(float);
  if (bytes > g_ws_bytes) {
    // Stream-ordered (detail::grow): the old buffer is freed after the ops queued before, with
    // no wait for the device (cudaFree would wait for an NCCL collective in flight too).
    g_ws = grow(g_ws, bytes);
    g_ws_bytes = bytes;
  }
  return static_cast<float*>(g_ws);
}

// ---- Layout kernels --------------------------------------------------------------------
// src (B,T,parts*C) packed [part 0 | part 1 | ...], head h of a part in columns h*hs..;
// dst: `parts` blocks of (B,NH,T,hs). to_heads copies src -> dst, from_heads dst -> src.
// Element i of the heads layout (part, b, h, t, d) -> its place in the packed layout.
template <typename I>
__device__ __forceinline__ I packed_index(I i, I B, I T, I C, I NH, I parts) {
  const I hs = C / NH;
  const I d = i % hs;
  I r = i / hs;
  const I t = r % T;
  r /= T;
  const I h = r % NH;
  r /= NH;
  const I b = r % B;
  const I p = r / B;
  return (b * T + t) * parts * C + p * C + h * hs + d;
}
// kToHeads: heads[i] = packed[...]; else packed[...] = heads[i].
template <typename I, bool kToHeads>
__global__ void relayout_kernel(float* dst, const float* src, I B, I T, I C, I NH, I parts) {
  STRATA_GRID_STRIDE_T(I, i, parts * B * T * C) {
    const I j = packed_index(i, B, T, C, NH, parts);
    if constexpr (kToHeads) dst[i] = src[j];
    else dst[j] = src[i];
  }
}

template <bool kToHeads>
void relayout(float* dst, const float* src, int B, int T, int C, int NH, int parts) {
  const int64_t n = int64_t(parts) * B * T * C;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    relayout_kernel<I, kToHeads><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        dst, src, I(B), I(T), I(C), I(NH), I(parts));
  });
  STRATA_CUDA_LAUNCHED();
}
void to_heads(float* dst, const float* src, int B, int T, int C, int NH, int parts) {
  relayout<true>(dst, src, B, T, C, NH, parts);
}
void from_heads(float* dst, const float* src, int B, int T, int C, int NH, int parts) {
  relayout<false>(dst, src, B, T, C, NH, parts);
}

// ---- Softmax over causal rows ----------------------------------------------------------
constexpr int kRowsPerBlock = kThreads / 32;

// att (rows, T), row r is query t1 = r % T: in place, att[0..t1] <- softmax(att[0..t1]),
// att[t1+1..T) <- 0. As the CPU: e = exp(s - max), then e * (1 / sum e).
__global__ void softmax_causal_forward_kernel(float* att, int64_t rows, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* s = att + row * T;
  const int L = int(row % T) + 1;
  float mx = -INFINITY;
  for (int j = lane; j < L; j += 32) mx = fmaxf(mx, s[j]);
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  for (int j = lane; j < L; j += 32) {
    const float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.f / warp_sum(sum);
  for (int j = lane; j < L; j += 32) s[j] *= inv;
  for (int j = L + lane; j < T; j += 32) s[j] = 0.f;
}

// g (rows, T) the gradient at att, p = att: in place, g[0..t1] <- p * (g - sum(p * g)),
// g[t1+1..T) <- 0.
__global__ void softmax_causal_backward_kernel(float* g, const float* att, int64_t rows, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* gr = g + row * T;
  const float* p = att + row * T;
  const int L = int(row % T) + 1;
  float dot = 0.f;
  for (int j = lane; j < L; j += 32) dot = fmaf(p[j], gr[j], dot);
  dot = warp_sum(dot);
  for (int j = lane; j < L; j += 32) gr[j] = p[j] * (gr[j] - dot);
  for (int j = L + lane; j < T; j += 32) gr[j] = 0.f;
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

// ---- Batched GEMM ----------------------------------------------------------------------
// For each of `batch` problems (strides sa, sb, sc): row-major C (M,N) = alpha op(A) op(B),
// op(A) (M,K), op(B) (K,N); as in linear.cu, computed as column-major C^T = op(B)^T op(A)^T.
void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  int64_t sa, const float* B, int ldb, int64_t sb, float* C, int ldc, int64_t sc,
                  int batch) {
  Context& cx = ctx();
  const float beta = 0.f;
  const cublasComputeType_t compute = cx.bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  STRATA_CUDA_CHECK(cublasGemmStridedBatchedEx(
      cx.cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha,
      B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa, &beta, C, CUDA_R_32F, ldc, sc, batch,
      compute, CUBLAS_GEMM_DEFAULT));
}

void check_heads(int C, int NH) {
  if (NH <= 0 || C % NH != 0)
    throw std::logic_error("cuda::attention: C = " + std::to_string(C) +
                           " is not a multiple of NH = " + std::to_string(NH));
}

}  // namespace

// qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T)
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  check_heads(C, NH);
  if (int64_t(B) * T * C == 0) return;
  const int hs = C / NH, BH = B * NH;
  const int64_t per = int64_t(B) * T * C;  // floats of one (B,NH,T,hs) block
  float* ws = workspace(size_t(4 * per));
  float* q = ws;
  float* k = ws + per;
  float* v = ws + 2 * per;
  float* y = ws + 3 * per;
  to_heads(q, qkv, B, T, C, NH, 3);
  const int64_t sh = int64_t(T) * hs, sa = int64_t(T) * T;
  // att (T,T) = scale * q (T,hs) @ k^T, per (b,h)
  gemm_batched(false, true, T, T, hs, 1.f / std::sqrt(float(hs)), q, hs, sh, k, hs, sh, att, T,
               sa, BH);
  softmax_causal_forward_kernel<<<row_blocks(int64_t(BH) * T), kThreads, 0, ctx().stream>>>(
      att, int64_t(BH) * T, T);
  STRATA_CUDA_LAUNCHED();
  // y (T,hs) = att (T,T) @ v (T,hs)
  gemm_batched(false, false, T, hs, T, 1.f, att, T, sa, v, hs, sh, y, hs, sh, BH);
  from_heads(out, y, B, T, C, NH, 1);
}

// dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) -> dqkv (B,T,3C)
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  check_heads(C, NH);
  if (int64_t(B) * T * C == 0) return;
  const int hs = C / NH, BH = B * NH;
  const int64_t per = int64_t(B) * T * C;
  const int64_t sh = int64_t(T) * hs, sa = int64_t(T) * T;
  float* ws = workspace(size_t(7 * per + BH * sa));
  float* q = ws;
  float* k = ws + per;
  float* v = ws + 2 * per;
  float* dy = ws + 3 * per;
  float* dq = ws + 4 * per;  // dq, dk, dv: one (3, B,NH,T,hs) block, copied back at once
  float* dk = ws + 5 * per;
  float* dv = ws + 6 * per;
  float* dp = ws + 7 * per;  // (B,NH,T,T)
  const float scale = 1.f / std::sqrt(float(hs));
  to_heads(q, qkv, B, T, C, NH, 3);
  to_heads(dy, dout, B, T, C, NH, 1);
  // dp (T,T) = dy (T,hs) @ v^T
  gemm_batched(false, true, T, T, hs, 1.f, dy, hs, sh, v, hs, sh, dp, T, sa, BH);
  // dv (T,hs) = att^T (T,T) @ dy (T,hs)
  gemm_batched(true, false, T, hs, T, 1.f, att, T, sa, dy, hs, sh, dv, hs, sh, BH);
  // dp <- the gradient at the scores (before the scale)
  softmax_causal_backward_kernel<<<row_blocks(int64_t(BH) * T), kThreads, 0, ctx().stream>>>(
      dp, att, int64_t(BH) * T, T);
  STRATA_CUDA_LAUNCHED();
  // dq (T,hs) = scale * dp (T,T) @ k;  dk (T,hs) = scale * dp^T @ q
  gemm_batched(false, false, T, hs, T, scale, dp, T, sa, k, hs, sh, dq, hs, sh, BH);
  gemm_batched(true, false, T, hs, T, scale, dp, T, sa, q, hs, sh, dk, hs, sh, BH);
  from_heads(dqkv, dq, B, T, C, NH, 3);
}

}  // namespace strata::cuda
