#include "model/optim.h"

#include "model/layers.h"
#include "strata/error.h"
#include "strata/lane_sums.h"

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

Optimizer::Optimizer(OptimConfig c, int64_t n, OptimShard shard)
    : c_(std::move(c)), n_(n), sharded_(shard.end >= 0),
      shard_(sharded_ ? shard : OptimShard{0, n}),
      state_base_(shard_.begin / kFlatAlign * kFlatAlign) {
  const int64_t m = shard_.end - state_base_;
  s0_ = h0_ = Tensor({m});
  if (c_.kind == "adamw") s1_ = h1_ = Tensor({m});
}

void Optimizer::place(const Backend& be) {
  if (s0_.memory == be.memory) return;
  s0_ = Tensor({h0_.size()}, *be.memory);
  if (h1_.storage) s1_ = Tensor({h1_.size()}, *be.memory);  // AdamW's second moment
  push(be);
}

void Optimizer::pull(const Backend& be) {
  for (auto [d, h] : {std::pair{&s0_, &h0_}, std::pair{&s1_, &h1_}})
    if (h->storage && d->data() != h->data())  // (SGD has no second buffer)
      be.download(h->data(), d->data(), sizeof(float) * size_t(h->size()));
}

void Optimizer::push(const Backend& be) {
  for (auto [d, h] : {std::pair{&s0_, &h0_}, std::pair{&s1_, &h1_}})
    if (h->storage && d->data() != h->data())
      be.upload(d->data(), h->data(), sizeof(float) * size_t(h->size()));
}

double Optimizer::step(const Backend& be, Tensor& params, Tensor& grads, int64_t step,
                       Comm* norm_over, const std::vector<FlatPieces>* norm_ranges,
                       Comm* shards_over) {
  const auto [first, last] = shard_;
  double norm = -1;  // a pass over every gradient: only when clipping needs it
  if (c_.grad_clip > 0) {
    double sq = 0;
    auto add = [&](const FlatPieces& range) {  // the part of the range in the shard
      FlatPieces mine;
      for (auto [b, n] : range) {
        const int64_t lo = std::max(b, first), hi = std::min(b + n, last);
        if (hi > lo) mine.push_back({lo, hi - lo});
      }
      if (!mine.empty()) sq += be.sum_squares(grads.data(), mine);
    };
    if (!norm_ranges) add({{0, n_}});
    else
      for (const FlatPieces& r : *norm_ranges) add(r);
    if (shards_over) shards_over->allreduce_sum(&sq, 1);
    if (norm_over) norm_over->allreduce_sum(&sq, 1);
    norm = std::sqrt(sq);
    if (norm > c_.grad_clip)
      be.scale_inplace(grads.data() + first, last - first, float(c_.grad_clip / (norm + 1e-6)));
  }
  apply(be, params, grads, first, last, step);
  end_step();
  return norm;
}

void Optimizer::apply(const Backend& be, Tensor& params, Tensor& grads, int64_t begin,
                      int64_t end, int64_t step) {
  begin = std::max(begin, shard_.begin), end = std::min(end, shard_.end);
  if (end <= begin) return;
  const int64_t n = end - begin, at = begin - state_base_;  // at: in the state buffers
  float* p = params.data() + begin;
  const float* g = grads.data() + begin;
  const float lr = float(lr_at(c_, step));
  if (target_) return apply_to(be, p, g, begin, n, at, lr);
  if (c_.kind == "adamw")
    be.adamw_update(p, g, s0_.data() + at, s1_.data() + at, n, lr, float(c_.beta1),
                    float(c_.beta2), float(c_.eps), float(c_.weight_decay), t_ + 1);
  else
    be.sgd_update(p, g, s0_.data() + at, n, lr, float(c_.momentum), float(c_.weight_decay),
                  c_.nesterov, t_ == 0);
}

bool Optimizer::can_update_to(const Backend& be) const {
  const bool writes_state = c_.kind == "adamw" || c_.momentum != 0;
  return !sharded_ && writes_state && be.supports(Op::sgd_update_to) &&
         be.supports(Op::adamw_update_to);
}

// Out of place into target_, with each output's lane sums placed at its blocks.
void Optimizer::apply_to(const Backend& be, const float* p, const float* g, int64_t begin,
                         int64_t n, int64_t at, float lr) {
  Target& t = *target_;
  STRATA_CHECK(begin % kSumLanes == 0 && at == begin, "an out-of-place update of a range that "
               "starts inside a block of the lane sums");
  uint32_t run[3 * kRunningWords] = {};
  const int64_t states = c_.kind == "adamw" ? 2 : 1;
  float* values = t.payload + t.values_at + begin;
  // (In place, the lines are in cache already: nothing to gain past it.)
  const bool stream = values != p && int64_t(sizeof(float)) * n_ * (1 + states) > kStreamAbove;
  float* s0 = t.payload + t.state_at[0] + at;
  if (c_.kind == "adamw")
    be.adamw_update_to(p, g, s0_.data() + at, s1_.data() + at, values, s0,
                       t.payload + t.state_at[1] + at, n, lr, float(c_.beta1), float(c_.beta2),
                       float(c_.eps), float(c_.weight_decay), t_ + 1, run, stream);
  else
    be.sgd_update_to(p, g, s0_.data() + at, values, s0, n, lr, float(c_.momentum),
                     float(c_.weight_decay), c_.nesterov, t_ == 0, run, stream);
  const int64_t blocks = lane_blocks(n);
  lane_sums_add(t.sums, run, blocks, (t.values_at + begin) / kSumLanes);
  for (int k = 0; k < states; ++k)
    lane_sums_add(t.sums, run + (k + 1) * kRunningWords, blocks, (t.state_at[k] + at) / kSumLanes);
  t.written += n;
}

void Optimizer::rebind_state(Tensor s0, Tensor s1) {
  STRATA_CHECK(s0_.data() == h0_.data() && s0.size() == h0_.size(), "rebind_state: another size");
  s0_ = h0_ = std::move(s0);
  if (c_.kind == "adamw") s1_ = h1_ = std::move(s1);
}

}  // namespace strata
