// Optimizer steps with torch.optim's update formulas and operation order: scalars (lr, bias
// corrections) are computed in double as Python does, the elementwise work in float as
// PyTorch's fp32 kernels do, so a run can be compared with PyTorch closely.
#include <algorithm>
#include <cmath>
#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "strata/kernels_cpu.h"

namespace strata::cpu {

// param, grad, momentum_buf (n). torch.optim.SGD with dampening 0:
//   g = grad + wd*p;  buf = first ? g : momentum*buf + g;
//   p -= lr * (nesterov ? g + momentum*buf : buf)
// With momentum == 0 the buffer is neither read nor written (it may be null).
namespace {

#if defined(__x86_64__)
// The momentum case (the common one), 16 floats at a time: the same operations in the same
// order as the scalar loop below, so the results are bitwise those of the scalar loop whatever
// the alignment of a range. Mul and add must never be fused: AVX-512F has FMA instructions, and
// GCC's default -ffp-contract=fast fused some of them (body and tail then rounded differently,
// so updating per layer in backward differed from one update after it); hence fp-contract=off.
// SSE2 code did 4 per iteration and was about 11% of an MLP training step.
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void sgd_momentum_avx512(float* param, const float* grad,
                                                            float* buf, int64_t n, float neg_lr,
                                                            float momentum, float wd,
                                                            bool nesterov, bool first_step) {
  const __m512 vlr = _mm512_set1_ps(neg_lr), vm = _mm512_set1_ps(momentum),
               vwd = _mm512_set1_ps(wd);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 p = _mm512_loadu_ps(param + i);
    const __m512 g = _mm512_add_ps(_mm512_loadu_ps(grad + i), _mm512_mul_ps(vwd, p));
    const __m512 b =
        first_step ? g : _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(buf + i), vm), g);
    _mm512_storeu_ps(buf + i, b);
    const __m512 step = nesterov ? _mm512_add_ps(g, _mm512_mul_ps(vm, b)) : b;
    _mm512_storeu_ps(param + i, _mm512_add_ps(p, _mm512_mul_ps(vlr, step)));
  }
  for (; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float b = first_step ? g : buf[i] * momentum + g;
    buf[i] = b;
    param[i] += neg_lr * (nesterov ? g + momentum * b : b);
  }
}

bool have_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

}  // namespace

void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step) {
  const float neg_lr = -lr;
#if defined(__x86_64__)
  if (momentum != 0.f && momentum_buf && have_avx512f()) {
    sgd_momentum_avx512(param, grad, momentum_buf, n, neg_lr, momentum, weight_decay, nesterov,
                        first_step);
    return;
  }
#endif
  if (momentum == 0.f || !momentum_buf) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      param[i] += neg_lr * g;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    const float buf = first_step ? g : momentum_buf[i] * momentum + g;
    momentum_buf[i] = buf;
    param[i] += neg_lr * (nesterov ? g + momentum * buf : buf);
  }
}

namespace {

// x = sqrt(x) elementwise. Without -fno-math-errno GCC cannot vectorise std::sqrt (it keeps a
// libm call to set errno for negative inputs), which made adamw_update 5.7x slower (2.4 ms vs
// 0.43 ms for 420k parameters); sqrtps is part of baseline x86-64 (SSE2).
void sqrt_inplace(float* x, int n) {
  int i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

}  // namespace

// param, grad, m, v (n); t is the 1-based step. torch.optim.AdamW:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = b2*v + (1-b2)*g*g;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  const float decay = float(1.0 - double(lr) * weight_decay);
  const float w = float(1.0 - double(beta1));  // lerp weight
  const float one_minus_b2 = float(1.0 - double(beta2));
  const double bias_c1 = 1.0 - std::pow(double(beta1), double(t));
  const double bias_c2 = 1.0 - std::pow(double(beta2), double(t));
  const float neg_step = float(-(double(lr) / bias_c1));
  const float bias_c2_sqrt = float(std::sqrt(bias_c2));
  // Blocks of three passes so each pass is a plain vectorisable loop (see sqrt_inplace).
  constexpr int kBlock = 256;
  float root[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int nb = int(std::min<int64_t>(kBlock, n - i0));
    float *p = param + i0, *mb = m + i0, *vb = v + i0;
    const float* g = grad + i0;
    for (int i = 0; i < nb; ++i) {
      p[i] *= decay;
      // torch.lerp's formula: exact at both ends of the weight range.
      mb[i] = w < 0.5f ? mb[i] + w * (g[i] - mb[i]) : g[i] - (g[i] - mb[i]) * (1.f - w);
      vb[i] = vb[i] * beta2 + one_minus_b2 * g[i] * g[i];
      root[i] = vb[i];
    }
    sqrt_inplace(root, nb);
    for (int i = 0; i < nb; ++i) {
      const float denom = root[i] / bias_c2_sqrt + eps;
      p[i] += neg_step * mb[i] / denom;  // addcdiv: p + (value * m) / denom
    }
  }
}

// The pieces of x -> sum of squares in double, as if the pieces were one array y of n floats:
// eight partial sums, y[k] into lane k % 8 (the loop vectorises; no -ffast-math) for k below
// the last multiple of 8, the tail into lane 0; then the lanes in order. The pieces' offsets
// in x do not change a lane: the sum is that of the packed layout, however x is padded.
double sum_squares(const float* x, const FlatPieces& pieces) {
  int64_t n = 0;
  for (const auto& [at, count] : pieces) n += count;
  const int64_t body = n / 8 * 8;  // y[0, body) in 8 lanes, y[body, n) in lane 0
  double acc[8] = {};
  int64_t k = 0;  // index in y
  for (const auto& [at, count] : pieces) {
    const float* p = x + at;
    int64_t i = 0;
    for (; i < count && k % 8 != 0 && k < body; ++i, ++k) acc[k % 8] += double(p[i]) * p[i];
    for (; i + 8 <= count && k + 8 <= body; i += 8, k += 8)
      for (int l = 0; l < 8; ++l) acc[l] += double(p[i + l]) * p[i + l];
    for (; i < count; ++i, ++k) acc[k < body ? k % 8 : 0] += double(p[i]) * p[i];
  }
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
}

// x (n) *= s
void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_inplace(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace strata::cpu
