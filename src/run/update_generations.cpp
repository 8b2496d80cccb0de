#include "run/update_generations.h"

#include <algorithm>

#include "strata/error.h"

namespace strata {

PartLayout part_layout(Model& model, Optimizer& opt, int64_t head) {
  PartLayout l;
  l.values_at = flat_span(head);
  l.floats = l.values_at + flat_span(model.host_values().size());
  int k = 0;
  for (auto& [name, t] : opt.state()) {
    l.state_at[k++] = l.floats;
    l.floats += flat_span(t->size());
  }
  return l;
}

UpdateGenerations::UpdateGenerations(MemoryCheckpoints& mem, Model& model, Optimizer& opt,
                                     const PartLayout& l)
    : mem_(mem), model_(model), opt_(opt), layout_(l) {}

bool UpdateGenerations::start() {
  double waited = 0;
  float* payload = mem_.open_slot(0, opt_.steps_taken(), &waited);
  if (!payload) return false;
  home_[0] = model_.host_values();
  home_grads_ = model_.grads();
  std::copy_n(home_[0].data(), home_[0].size(), payload + layout_.values_at);
  int k = 0;
  for (auto& [name, t] : opt_.state()) {
    home_[k + 1] = *t;
    std::copy_n(t->data(), t->size(), payload + layout_.state_at[k++]);
  }
  rebind(payload);
  live_ = 0;
  return true;
}

void UpdateGenerations::before_update(double* wait_s) {
  STRATA_CHECK(live_ >= 0, "UpdateGenerations: an update before start()");
  const int slot = mem_.one_part() ? live_ : live_ ^ 1;
  float* payload = opened_ ? opened_ : mem_.open_slot(slot, opt_.steps_taken() + 1, wait_s);
  target_ = {};
  std::fill(std::begin(sums_), std::end(sums_), 0u);
  if (!payload) {
    // A target that cannot be made (warned) leaves this update in place: the live file first
    // waits for its exchange and is marked as being written; the save sends the partner
    // nothing it keeps.
    double more = 0;
    mem_.open_slot(live_, opt_.steps_taken() + 1, &more);
    *wait_s += more;
    return;
  }
  target_ = {.payload = payload,
             .values_at = layout_.values_at,
             .state_at = {layout_.state_at[0], layout_.state_at[1]},
             .sums = sums_};
  opt_.set_target(&target_);
}

void UpdateGenerations::after_update() {
  if (live_ < 0) return;
  opt_.set_target(nullptr);
  if (target_.written == 0) return grads_home();  // no update ran
  STRATA_CHECK(target_.written == model_.host_values().size(),
               "memory checkpoint: the update wrote part of the parameters only");
  if (!mem_.one_part()) {  // else the update wrote the live generation in place
    rebind(target_.payload);
    live_ ^= 1;
  }
  written_ = true;
  ++updates_;
  over_grads_ += opened_ ? 1 : 0;
  grads_home();  // (the next backward must not write over the state just written)
}

void UpdateGenerations::grads_home() {
  if (!opened_) return;
  model_.layout().rebind_grads(home_grads_);
  opened_ = nullptr;
}

void UpdateGenerations::save(int64_t step, const float* head, int64_t head_floats) {
  float* payload = written_ ? target_.payload : nullptr;
  if (payload) {  // the head and the zeros after it, block 0 on
    std::copy_n(head, head_floats, payload);
    lane_sums_place(sums_, payload, layout_.values_at, 0);
  }
  // Without a generation written, the exchange still goes, since the partner waits for it;
  // the copy it gets names no step and is not kept.
  mem_.publish_slot(live_, step, payload ? sums_ : nullptr);
  written_ = false;
}

void UpdateGenerations::before_backward() {
  // (Not waited for: the update will.)
  if (mem_.one_part() || live_ < 0 || opened_ || !mem_.slot_free(live_ ^ 1)) return;
  double waited = 0;
  opened_ = mem_.open_slot(live_ ^ 1, opt_.steps_taken() + 1, &waited);
  if (opened_)
    model_.layout().rebind_grads(Tensor::view(
        opened_ + layout_.state_at[opt_.state_over_grad()], {home_grads_.size()}));
}

void UpdateGenerations::rebind(float* payload) {
  model_.layout().rebind_values(Tensor::view(payload + layout_.values_at, {home_[0].size()}));
  Tensor s[2];
  for (int k = 0; k < 2; ++k)
    if (home_[k + 1].ptr) s[k] = Tensor::view(payload + layout_.state_at[k], {home_[k + 1].size()});
  opt_.rebind_state(s[0], s[1]);
}

void UpdateGenerations::move_home() {
  if (live_ < 0) return;
  opt_.set_target(nullptr);
  grads_home();
  const float* payload = model_.host_values().data() - layout_.values_at;
  for (int k = 0; k < 3; ++k)
    if (home_[k].ptr)
      std::copy_n(payload + (k == 0 ? layout_.values_at : layout_.state_at[k - 1]), home_[k].size(),
                  home_[k].data());
  model_.layout().rebind_values(home_[0]);
  opt_.rebind_state(home_[1], home_[2]);
  live_ = -1;
}

}  // namespace strata
