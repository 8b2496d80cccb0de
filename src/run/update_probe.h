// checkpoint.memory_budget where the optimizer's update can write the memory-checkpoint
// generations (run/update_generations.h): what that costs is in the update's own time, not in
// a save's, so the budget measures it (run/memory_state.h decides). The update is timed in
// place over a launch's first `steps` steps (no saves), then writing the generations over as
// many.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "base/stats.h"

namespace strata {

class UpdateProbe {
 public:
  enum class Phase { off, in_place, writing };
  UpdateProbe(bool on, size_t steps) : phase_(on ? Phase::in_place : Phase::off), steps_(steps) {}
  Phase phase() const { return phase_; }
  void stop() { phase_ = Phase::off; }

  void update_starts() { t0_ = std::chrono::steady_clock::now(); }
  // The update's time (on one rank the backward it runs in included).
  void update_ends() { times().update.push_back(seconds_since(t0_)); }
  // After each step; true once the writing phase has its steps (cost() then). The in-place
  // phase's end moves to writing: the generations start at the next update.
  bool step_ends(double seconds) {
    times().step.push_back(seconds);
    if (times().update.size() < steps_) return false;
    if (phase_ == Phase::writing) return true;
    phase_ = Phase::writing;
    return false;
  }

  struct Cost {
    double per_step, step, writing, in_place;  // seconds: the cost a step, the step in place, the updates
  };
  // The update's difference and `saves` (a save's stall and its update's wait), a step. With a
  // partner, whose exchange of every generation runs beside the steps where the update's time
  // does not see it, the steps' own difference where larger (the phases follow each other, so
  // the machine's drift may add to it: the budget then errs towards copies).
  Cost cost(double saves, bool partner) const {
    Cost c{.per_step = 0, .step = std::max(median(in_place_.step), 1e-9),
           .writing = median(writing_.update), .in_place = median(in_place_.update)};
    c.per_step = std::max(c.writing - c.in_place, 0.0) + saves;
    if (partner) c.per_step = std::max(c.per_step, median(writing_.step) - c.step);
    return c;
  }

 private:
  struct Times {
    std::vector<double> update, step;
  };
  Times& times() { return phase_ == Phase::in_place ? in_place_ : writing_; }
  Phase phase_;
  size_t steps_;
  Times in_place_, writing_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace strata
