#include "run/divergence.h"

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {

void report_divergence(const Divergence& d, bool reporter, MetricsWriter* metrics) {
  if (metrics)
    metrics->write({{"event", json_string("diverged")}, {"step", fmt::format("{}", d.step)},
                    {d.field, d.value}});
  if (!reporter) throw AgreedFailure(kExitDiverged, "");
  throw UserError(kExitDiverged, fmt::format("step {}: {} (training diverged; lower train.lr or "
                                             "set train.grad_clip); {}",
                                             d.step, d.what, d.not_written));
}

}  // namespace strata
