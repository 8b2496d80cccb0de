// Training diverged: one report wherever it is found (a NaN/Inf loss, parameters or optimizer
// state made NaN/Inf by an update, a NaN/Inf test loss).
#pragma once
#include <cstdint>
#include <string>

#include "base/metrics.h"
#include "strata/comm.h"

namespace strata {

struct Divergence {
  int64_t step = 0;
  std::string what;         // "loss is NaN", "the test loss is Inf", ...
  std::string field;        // the metrics event's field: "loss", "test_loss"
  std::string value;        // its JSON value ("null" when not a number)
  std::string not_written;  // "no parameters were written", "model.h5 was not written", ...
};

// The metrics file's "diverged" event (when `metrics` is set: rank 0's), then the one error
// line "step S: WHAT (training diverged; lower train.lr or set train.grad_clip); NOT_WRITTEN",
// thrown as UserError(kExitDiverged) by the reporting rank and as AgreedFailure by the others
// (every rank calls this for the same step: what diverged was agreed on).
[[noreturn]] void report_divergence(const Divergence& d, bool reporter, MetricsWriter* metrics);

}  // namespace strata
