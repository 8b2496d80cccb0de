// When a run writes checkpoints: every checkpoint.every_steps steps and every
// checkpoint.every_seconds seconds (periodic), and once at the end (checkpoint.final). The one
// place that decides; the step hooks, the publisher and the session ask it.
#pragma once
#include <cstdint>

#include "config/config.h"

namespace strata {

class CheckpointPolicy {
 public:
  explicit CheckpointPolicy(const RunConfig::Checkpoint& c) : c_(c) {}
  // Periodic checkpoints configured (by steps or by time).
  bool periodic() const { return c_.every_steps > 0 || c_.every_seconds > 0; }
  // After `done` of `total` steps, `since_last_s` seconds after the last checkpoint: a periodic
  // one is due (never after the last step: the final one covers it). `time_due` is the ranks'
  // agreement on the time rule (rank 0's clock: time_due_by()).
  bool due(int64_t done, int64_t total, bool time_due) const {
    return done < total && ((c_.every_steps > 0 && done % c_.every_steps == 0) || time_due);
  }
  bool time_due_by(double since_last_s) const {
    return c_.every_seconds > 0 && since_last_s >= c_.every_seconds;
  }
  // At the end of `total` steps with the newest checkpoint at `last_step`: the final one.
  bool final_due(int64_t last_step, int64_t total) const {
    return periodic() && c_.final && last_step < total;
  }

 private:
  RunConfig::Checkpoint c_;
};

}  // namespace strata
