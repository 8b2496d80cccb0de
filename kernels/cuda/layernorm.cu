// LayerNorm over the last dimension on the GPU (PyTorch's nn.LayerNorm(C): eps 1e-5, biased
// variance), forward and backward, and the residual add; the contracts of
// kernels/cpu/layernorm.cpp.
//
// One warp per row, fp32 throughout: the mean first, then the variance from it (two passes
// over the row, as the CPU, which keeps the variance of rows with a large mean), rstd =
// 1/sqrtf (IEEE, not rsqrtf's approximation). Row sums are warp reductions in a fixed order,
// so results repeat bit for bit; they differ from the CPU's (another summation order) by
// rounding only.
//
// The parameter gradients are sums over rows, made deterministic without atomics as the
// CPU makes them: rows in chunks of kRows, one thread per (chunk, channel) adds its chunk's
// rows in row order into a partial; a second pass adds each channel's partials in chunk
// order. The chunking depends on N only, so does the result (given the inputs, it is the
// CPU's order of additions exactly).
#include <cmath>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

constexpr float kEps = 1e-5f;   // PyTorch's default
constexpr int kRows = 64;       // rows per chunk of the parameter-gradient sums (the CPU's)
constexpr int kRowsPerBlock = kThreads / 32;

// inp (N,C), weight (C), bias (C) -> out (N,C), mean (N), rstd (N); one warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + int64_t(row) * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / float(C);
  float ss = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    ss = fmaf(d, d, ss);
  }
  const float r = 1.f / sqrtf(warp_sum(ss) / float(C) + kEps);
  float* o = out + int64_t(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

// dx (N,C) = r * (g - mean(g) - xhat * mean(g * xhat)), g = w * dy, xhat = (x - m) * r;
// one warp per row.
__global__ void layernorm_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N,
                                      int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const int64_t o = int64_t(row) * C;
  const float* dy = dout + o;
  const float* x = inp + o;
  const float m = mean[row], r = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float g = w[c] * dy[c];
    sg += g;
    sgx = fmaf(g, (x[c] - m) * r, sgx);
  }
  const float mg = warp_sum(sg) / float(C), mgx = warp_sum(sgx) / float(C);
  float* dx = dinp + o;
  for (int c = lane; c < C; c += 32) {
    const float xh = (x[c] - m) * r;
    dx[c] = (w[c] * dy[c] - mg - xh * mgx) * r;
  }
}

// Chunk ch's partials, one thread per channel c: pw[c] = sum over its rows, in order, of
// dy * xhat; pb[c] = sum of dy (blockIdx.y strides over the chunks). With one chunk they go
// to dweight and dbias directly ((accumulate ? d : 0) + the sum). The products and sums are rounded one by one
// (__fmul_rn/__fadd_rn: no FMA contraction), the CPU's arithmetic.
__global__ void layernorm_param_partial_kernel(float* partial, float* dweight, float* dbias,
                                               const float* dout, const float* inp,
                                               const float* mean, const float* rstd, int N, int C,
                                               int chunks, bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
    const int r0 = ch * kRows, r1 = min(N, r0 + kRows);
    float pw = 0.f, pb = 0.f;
    for (int r = r0; r < r1; ++r) {
      const int64_t i = int64_t(r) * C + c;
      const float dy = dout[i];
      const float xh = __fmul_rn(__fsub_rn(inp[i], mean[r]), rstd[r]);
      pw = __fadd_rn(pw, __fmul_rn(dy, xh));
      pb = __fadd_rn(pb, dy);
    }
    if (chunks == 1) {
      if (dweight) dweight[c] = accumulate ? __fadd_rn(dweight[c], pw) : pw;
      if (dbias) dbias[c] = accumulate ? __fadd_rn(dbias[c], pb) : pb;
    } else {
      partial[int64_t(ch) * 2 * C + c] = pw;
      partial[int64_t(ch) * 2 * C + C + c] = pb;
    }
  }
}

// d[c] = (accumulate ? d[c] + p0 : p0) + p1 + p2 + ..., chunks in order.
__global__ void layernorm_param_final_kernel(float* dweight, float* dbias, const float* partial,
                                             int chunks, int C, bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int which = 0; which < 2; ++which) {
    float* d = which == 0 ? dweight : dbias;
    if (!d) continue;
    const float* p = partial + int64_t(which) * C + c;
    float s = accumulate ? __fadd_rn(d[c], p[0]) : p[0];
    for (int ch = 1; ch < chunks; ++ch) s = __fadd_rn(s, p[int64_t(ch) * 2 * C]);
    d[c] = s;
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  STRATA_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

unsigned row_blocks(int N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

// inp (N,C), weight (C), bias (C) -> out (N,C), mean (N), rstd (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_forward_kernel<<<row_blocks(N), kThreads, 0, ctx().stream>>>(out, mean, rstd, inp,
                                                                         weight, bias, N, C);
  STRATA_CUDA_LAUNCHED();
}

// dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) -> dinp (N,C), dweight (C), dbias (C)
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C, bool accumulate) {
  if (C <= 0) return;
  Context& cx = ctx();
  if (dinp && N > 0) {
    layernorm_dinp_kernel<<<row_blocks(N), kThreads, 0, cx.stream>>>(dinp, dout, inp, weight,
                                                                     mean, rstd, N, C);
    STRATA_CUDA_LAUNCHED();
  }
  if (!dweight && !dbias) return;
  if (N <= 0) {  // an empty sum
    if (!accumulate) {
      if (dweight) zero(dweight, sizeof(float) * size_t(C));
      if (dbias) zero(dbias, sizeof(float) * size_t(C));
    }
    return;
  }
  const int chunks = (N + kRows - 1) / kRows;
  float* partial = chunks > 1 ? static_cast<float*>(
                                    reduce_scratch(sizeof(float) * 2 * size_t(C) * size_t(chunks)))
                              : nullptr;
  const dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned(std::min(chunks, 65535)));
  layernorm_param_partial_kernel<<<grid, kThreads, 0, cx.stream>>>(
      partial, dweight, dbias, dout, inp, mean, rstd, N, C, chunks, accumulate);
  STRATA_CUDA_LAUNCHED();
  if (chunks > 1) {
    layernorm_param_final_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, cx.stream>>>(
        dweight, dbias, partial, chunks, C, accumulate);
    STRATA_CUDA_LAUNCHED();
  }
}

// a (n), b (n) -> out (n) = a + b; out may be a or b
void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  residual_forward_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(out, a, b, n);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
