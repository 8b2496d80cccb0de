// Optimizer steps with the CPU kernel's (torch.optim's) formulas and operation order. Scalars
// are computed on the host exactly as kernels/cpu/optimizer.cpp does; the elementwise work
// uses __fmul_rn/__fadd_rn/__fdiv_rn so nvcc cannot contract a*b+c into an FMA: the same
// roundings as the CPU's (which is built without FMA contraction), so the results match it.
// sum_squares accumulates in double, like the CPU.
#include <cmath>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// torch.optim.SGD, dampening 0:
//   g = grad + wd*p;  buf = first ? g : buf*momentum + g;  p += -lr * (nesterov ? g + momentum*buf : buf)
__global__ void sgd_momentum_kernel(float* param, const float* grad, float* buf, int64_t n,
                                    float neg_lr, float momentum, float wd, bool nesterov,
                                    bool first_step) {
  STRATA_GRID_STRIDE(i, n) {
    const float p = param[i];
    const float g = __fadd_rn(grad[i], __fmul_rn(wd, p));
    const float b = first_step ? g : __fadd_rn(__fmul_rn(buf[i], momentum), g);
    buf[i] = b;
    const float step = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
    param[i] = __fadd_rn(p, __fmul_rn(neg_lr, step));
  }
}

// Without momentum (or buffer): p += -lr * (grad + wd*p)
__global__ void sgd_plain_kernel(float* param, const float* grad, int64_t n, float neg_lr,
                                 float wd) {
  STRATA_GRID_STRIDE(i, n) {
    const float p = param[i];
    const float g = __fadd_rn(grad[i], __fmul_rn(wd, p));
    param[i] = __fadd_rn(p, __fmul_rn(neg_lr, g));
  }
}

// torch.optim.AdamW:
//   p *= decay;  m = lerp(m, g, w);  v = v*b2 + (1-b2)*g*g;
//   p += neg_step * m / (sqrt(v)/sqrt(bias_c2) + eps)
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             float decay, float w, float beta2, float one_minus_b2, float eps,
                             float neg_step, float bias_c2_sqrt) {
  STRATA_GRID_STRIDE(i, n) {
    const float g = grad[i];
    const float p = __fmul_rn(param[i], decay);
    const float mi = m[i];
    // torch.lerp's formula: exact at both ends of the weight range.
    const float mn = w < 0.5f ? __fadd_rn(mi, __fmul_rn(w, __fsub_rn(g, mi)))
                              : __fsub_rn(g, __fmul_rn(__fsub_rn(g, mi), __fsub_rn(1.f, w)));
    const float vn = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    m[i] = mn;
    v[i] = vn;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vn), bias_c2_sqrt), eps);
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step, mn), denom));
  }
}

// Pass 1 of sum_squares: each block's sum of x^2 in double; pass 2 adds the block sums.
constexpr int kSumBlocksMax = 1024;
__global__ void sum_squares_kernel(double* partial, const float* x, int64_t n) {
  double s = 0.0;
  STRATA_GRID_STRIDE(i, n) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// 1024 threads: the launch bound keeps nvcc to 64 registers a thread, or the launch fails.
__global__ void __launch_bounds__(kSumBlocksMax) sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  STRATA_GRID_STRIDE(i, n) x[i] *= s;
}

}  // namespace

// param, grad, momentum_buf (n); with momentum == 0 the buffer is neither read nor written.
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step) {
  if (n <= 0) return;
  const float neg_lr = -lr;
  cudaStream_t s = ctx().stream;
  if (momentum == 0.f || !momentum_buf)
    sgd_plain_kernel<<<blocks_for(n), kThreads, 0, s>>>(param, grad, n, neg_lr, weight_decay);
  else
    sgd_momentum_kernel<<<blocks_for(n), kThreads, 0, s>>>(
        param, grad, momentum_buf, n, neg_lr, momentum, weight_decay, nesterov, first_step);
  STRATA_CUDA_LAUNCHED();
}

// param, grad, m, v (n); t is the 1-based step
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  if (n <= 0) return;
  // The CPU kernel's scalars, computed the same way (double, as Python does).
  const float decay = float(1.0 - double(lr) * weight_decay);
  const float w = float(1.0 - double(beta1));
  const float one_minus_b2 = float(1.0 - double(beta2));
  const double bias_c1 = 1.0 - std::pow(double(beta1), double(t));
  const double bias_c2 = 1.0 - std::pow(double(beta2), double(t));
  const float neg_step = float(-(double(lr) / bias_c1));
  const float bias_c2_sqrt = float(std::sqrt(bias_c2));
  adamw_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(
      param, grad, m, v, n, decay, w, beta2, one_minus_b2, eps, neg_step, bias_c2_sqrt);
  STRATA_CUDA_LAUNCHED();
}

// The pieces of x -> sum of x^2 in double, over the span from the first piece's start to the
// last one's end (the floats between pieces are zero). The block count depends on that span
// only, so the summation order, hence the result, is the same on every run.
double sum_squares(const float* x, const FlatPieces& pieces) {
  if (pieces.empty()) return 0.0;
  x += pieces.front().first;
  const int64_t n = pieces.back().first + pieces.back().second - pieces.front().first;
  if (n <= 0) return 0.0;
  cudaStream_t s = ctx().stream;
  const int blocks = int(std::clamp<int64_t>((n + 4095) / 4096, 1, kSumBlocksMax));
  auto* buf = static_cast<double*>(reduce_scratch(sizeof(double) * (kSumBlocksMax + 1)));
  sum_squares_kernel<<<blocks, kThreads, 0, s>>>(buf + 1, x, n);
  STRATA_CUDA_LAUNCHED();
  sum_partials_kernel<<<1, kSumBlocksMax, 0, s>>>(buf, buf + 1, blocks);
  STRATA_CUDA_LAUNCHED();
  return *static_cast<const double*>(fetch_result(buf, sizeof(double)));
}

// x (n) *= s
void scale_inplace(float* x, int64_t n, float s) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(x, n, s);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
