#include "strata/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata {

double lr_at(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps) return c.lr * double(step + 1) / c.warmup_steps;
  if (c.schedule == "cosine") {
    int64_t span = std::max<int64_t>(1, c.total_steps - c.warmup_steps);
    double t = std::clamp(double(step - c.warmup_steps) / span, 0.0, 1.0);
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * t));
  }
  return c.lr;
}

Optimizer::Optimizer(OptimConfig c, int64_t n) : c_(std::move(c)) {
  s0_ = Tensor({n});
  if (c_.kind == "adamw") s1_ = Tensor({n});
}

double Optimizer::step(const Backend& be, Tensor& params, Tensor& grads, int64_t step,
                       Comm* norm_over) {
  const int64_t n = params.size();
  double norm = -1;  // a pass over every gradient: only when clipping needs it
  if (c_.grad_clip > 0) {
    double sq = be.sum_squares(grads.data(), n);
    if (norm_over) norm_over->allreduce_sum(&sq, 1);
    norm = std::sqrt(sq);
    if (norm > c_.grad_clip) be.scale_inplace(grads.data(), n, float(c_.grad_clip / (norm + 1e-6)));
  }
  apply(be, params, grads, 0, n, step);
  end_step();
  return norm;
}

void Optimizer::apply(const Backend& be, Tensor& params, Tensor& grads, int64_t begin,
                      int64_t end, int64_t step) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  float* p = params.data() + begin;
  const float* g = grads.data() + begin;
  const float lr = float(lr_at(c_, step));
  if (c_.kind == "adamw")
    be.adamw_update(p, g, s0_.data() + begin, s1_.data() + begin, n, lr, float(c_.beta1),
                    float(c_.beta2), float(c_.eps), float(c_.weight_decay), t_ + 1);
  else
    be.sgd_update(p, g, s0_.data() + begin, n, lr, float(c_.momentum), float(c_.weight_decay),
                  c_.nesterov, t_ == 0);
}

}  // namespace strata
