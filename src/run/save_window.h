// The memory budget's measuring window (run/memory_state.h): each step's time, and the same
// split into the steps right after a save and the others. A save's copy runs beside the step
// after it, and what it costs that step can exceed the copy's own time (the update then takes
// back the lines the copying core read); steps of both kinds interleave in one window, so a
// slow phase of the machine slows both and their difference stays the copy's.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/stats.h"

namespace strata {

class SaveWindow {
 public:
  void saved(int64_t steps_done) { before_ = std::exchange(last_, steps_done); }
  // The step that made `steps_done`, after saved() for a save at its own end.
  void step(int64_t steps_done, double seconds) {
    all_.push_back(seconds);
    const int64_t previous = last_ == steps_done ? before_ : last_;
    (previous == steps_done - 1 ? after_ : others_).push_back(seconds);
  }
  size_t steps() const { return all_.size(); }
  double median_step() const { return median(all_); }
  // The median step after a save less the median other step, at least 0; -1 while either kind
  // has fewer than kMin steps (a save every step has no others).
  double slowdown() const {
    if (after_.size() < kMin || others_.size() < kMin) return -1;
    return std::max(median(after_) - median(others_), 0.0);
  }
  void clear() { all_.clear(), after_.clear(), others_.clear(); }

 private:
  static constexpr size_t kMin = 4;
  std::vector<double> all_, after_, others_;
  int64_t last_ = -1, before_ = -1;  // the steps the last two saves followed
};

}  // namespace strata
