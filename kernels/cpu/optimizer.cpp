// Optimizer steps with torch.optim's update formulas and operation order: scalars (lr, bias
// corrections) are computed in double as Python does, the elementwise work in float as
// PyTorch's fp32 kernels do, so a run can be compared with PyTorch closely.
#include <cmath>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

// param, grad, momentum_buf (n). torch.optim.SGD with dampening 0:
//   g = grad + wd*p;  buf = first ? g : momentum*buf + g;
//   p -= lr * (nesterov ? g + momentum*buf : buf)
// With momentum == 0 the buffer is neither read nor written (it may be null).
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step) {
  const float neg_lr = -lr;
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
  const float step_size = float(double(lr) / bias_c1);
  const float bias_c2_sqrt = float(std::sqrt(bias_c2));
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    param[i] *= decay;
    // torch.lerp's formula: exact at both ends of the weight range.
    const float mi = w < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.f - w);
    const float vi = v[i] * beta2 + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bias_c2_sqrt + eps;
    param[i] += -step_size * mi / denom;  // addcdiv: p + (value * m) / denom
  }
}

// x (n) -> sum of x^2 in double. Eight partial sums so the loop vectorises (no -ffast-math).
double sum_squares(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += double(x[i + l]) * x[i + l];
  for (; i < n; ++i) acc[0] += double(x[i]) * x[i];
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
}

// x (n) *= s
void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace strata::cpu
