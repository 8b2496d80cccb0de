// A pipeline schedule simulated with each op's own cost: parallel/pipeline_schedule.h's
// schedule_idle_shares gives every F, B and W one unit; here each (stage, chunk) has its own
// seconds for F, the whole backward, B and W, and each activation or gradient crossing from
// one stage to the next takes `send_s`. Every stage runs its list in order, an op as soon as
// its own previous op and the op it waits for (F: the virtual stage before's F of the same
// micro-batch; B: the one after's B) are done, as PipelineStage does.
#pragma once
#include <string>
#include <vector>

namespace strata {

struct OpCosts {
  double forward = 0;
  double backward = 0;  // the whole backward (gpipe, 1f1b, interleaved)
  double backward_input = 0, backward_weight = 0;  // zero-bubble schedules' B and W
};

struct ScheduleSim {
  double span = 0;             // from the first forward to the last op anywhere
  std::vector<double> busy;    // per stage: seconds of its own work
  std::vector<double> finish;  // per stage: when its last op ends
  std::vector<double> idle;    // per stage: (span - busy) / span
  double bubble() const;       // the idle shares' mean
};

// costs[stage][chunk]; chunks = v (1 but for interleaved). Throws std::logic_error when the
// schedule deadlocks (pipeline_schedule.h's tests rule that out).
ScheduleSim simulate_schedule(const std::string& kind, int stages, int micros, int chunks,
                              const std::vector<std::vector<OpCosts>>& costs, double send_s);

}  // namespace strata
