#include "plan/step_time.h"

#include "strata/error.h"

namespace strata {

PlannedModel plan_model(const RunConfig&) { throw std::logic_error("plan_model: not yet"); }

StepTime predict_step_time(const RunConfig&, const PlannedModel&, const GridChoice&,
                           const MachineProfile&, const CommModel&) {
  throw std::logic_error("predict_step_time: not yet");
}

StepTime predict_step_time(const RunConfig& cfg, const GridChoice& g, const MachineProfile& layers,
                           const CommModel& comm) {
  return predict_step_time(cfg, plan_model(cfg), g, layers, comm);
}

}  // namespace strata
