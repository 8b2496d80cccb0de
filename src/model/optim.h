// Optimizers over the model's flat parameter buffer, the learning-rate schedule and
// global-norm gradient clipping.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/backend.h"
#include "strata/comm.h"
#include "strata/tensor.h"

namespace strata {

struct OptimConfig {
  std::string kind = "sgd";  // sgd | adamw
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::string schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  int64_t total_steps = 1;  // for cosine decay
  double grad_clip = 0.0;   // 0 = off
};

// lr at 0-based step: linear warmup from lr/warmup to lr, then constant or cosine to min_lr.
double lr_at(const OptimConfig& c, int64_t step);

// The part [begin, end) of the flat buffers an optimizer updates and keeps state for: the whole
// buffer, or with ZeRO (zero.h) this rank's shard of it.
struct OptimShard {
  int64_t begin = 0, end = -1;  // end < 0: the whole buffer, unsharded
};

class Optimizer {
 public:
  Optimizer(OptimConfig c, int64_t num_params, OptimShard shard = {});
  // The flat buffer's size and the part of it this optimizer owns.
  int64_t num_params() const { return n_; }
  const OptimShard& shard() const { return shard_; }
  // Given a shard (ZeRO), even one that is the whole buffer or empty: the same answer on
  // every rank of a run, so collective paths can branch on it.
  bool sharded() const { return sharded_; }
  const OptimConfig& config() const { return c_; }
  // Clips (if configured) and applies one update to the shard. Returns the global gradient
  // norm before clipping, or -1 when clipping is off (the norm is not computed then). `step`
  // is 0-based. Only the shard's gradients are read: the norm sums this rank's squares over
  // norm_ranges (Model::norm_ranges; null: all of it) within the shard, then over
  // shards_over (the other shards' owners; null when unsharded) and norm_over (the ranks
  // holding the other parts of the model: a pipeline's stages, a tensor group).
  double step(const Backend& be, Tensor& params, Tensor& grads, int64_t step,
              Comm* norm_over = nullptr,
              const std::vector<FlatPieces>* norm_ranges = nullptr,
              Comm* shards_over = nullptr);
  // The same update in pieces: apply() to ranges [begin, end) of the flat buffers as their
  // gradients become final, then end_step() once. Only without clipping, which needs the
  // global norm first.
  bool can_update_in_backward() const { return c_.grad_clip <= 0; }
  void apply(const Backend& be, Tensor& params, Tensor& grads, int64_t begin, int64_t end,
             int64_t step);
  void end_step() { ++t_; }

  // State for checkpoints: named HOST buffers, each parallel to the shard of the flat
  // parameter buffer (momentum for SGD; exp_avg and exp_avg_sq for AdamW), and the count of
  // steps taken. Checkpoints take an unsharded optimizer (zero.h assembles one). Element i of
  // a state buffer is that of flat index state_base() + i: the shard's begin rounded down to a
  // 256-byte boundary (ZeRO's shards split the packed layout, so a shard may begin inside a
  // tensor), so each tensor's state lies as aligned as the tensor; the floats before the
  // shard's begin are unused.
  int64_t state_base() const { return state_base_; }
  std::vector<std::pair<std::string, Tensor*>> state() {
    const auto names = state_names(c_.kind);
    if (names.size() == 2) return {{names[0], &h0_}, {names[1], &h1_}};
    return {{names[0], &h0_}};
  }
  static std::vector<std::string> state_names(const std::string& kind) {
    if (kind == "adamw") return {"exp_avg", "exp_avg_sq"};
    return {"momentum"};
  }
  // As Model's: the state the updates use moves to the backend's memory (place), and is
  // copied to (pull) and from (push) the host buffers of state().
  void place(const Backend& be);
  // The buffers the updates use (the backend's memory), in state()'s order.
  std::vector<const Tensor*> used_state() const {
    if (c_.kind == "adamw") return {&s0_, &s1_};
    return {&s0_};
  }
  void pull(const Backend& be);
  void push(const Backend& be);
  int64_t steps_taken() const { return t_; }

  // Out of place (memory checkpoints that the update writes itself, run/memory_state.h): while
  // a target is set, apply() reads the parameters and state where they are and writes the new
  // ones into the target's payload (values and each state at their offsets, multiples of 16
  // floats), adding their lane sums (strata/lane_sums.h) into `sums`, each placed at its
  // block. Counts the floats written, so the caller can tell a whole update from none. Only
  // unsharded, on a backend that has the out-of-place ops, and with a state every update
  // writes (SGD with momentum, AdamW): can_update_to().
  struct Target {
    float* payload = nullptr;
    int64_t values_at = 0, state_at[2] = {0, 0};  // floats into the payload
    uint32_t* sums = nullptr;                      // the payload's lane sums (a, b)
    int64_t written = 0;                           // floats of values written so far
  };
  bool can_update_to(const Backend& be) const;
  // The state (in state()'s order) an out-of-place update may write over its gradient: each
  // element of it is stored after the gradient's element was last read (SGD's momentum,
  // AdamW's exp_avg_sq; ops.def).
  int state_over_grad() const { return c_.kind == "adamw" ? 1 : 0; }
  // Out of place, the stores go past the cache when an update writes more than this many
  // bytes: the next update then reads them from memory anyway, and stores through the cache
  // would first read every line they write (benchmarks/bench_update.cpp measures both).
  static constexpr int64_t kStreamAbove = int64_t(6) << 20;
  void set_target(Target* t) { target_ = t; }
  // The host buffers the updates use from now on, in state()'s order (a written target's).
  void rebind_state(Tensor s0, Tensor s1);
  int64_t state_bytes() const { return int64_t(sizeof(float)) * (h0_.size() + h1_.size()); }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  OptimConfig c_;
  int64_t n_;
  bool sharded_;
  OptimShard shard_;
  int64_t state_base_;  // flat index of the state buffers' first element
  Tensor s0_, s1_;  // what the updates use
  Tensor h0_, h1_;  // their host copies (the same storage on the CPU)
  int64_t t_ = 0;
  Target* target_ = nullptr;
  void apply_to(const Backend& be, const float* p, const float* g, int64_t begin, int64_t n,
                int64_t at, float lr);
};

}  // namespace strata
