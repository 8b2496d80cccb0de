// What `strata plan` prints: the best grids as a table with their reasons, or every grid as
// JSON for scripts.
#pragma once
#include <cstdint>
#include <string>

#include "plan/grid_search.h"

namespace strata {

struct PlanHeader {
  std::string config;   // the config file ("" = flags only)
  std::string model;    // "124,439,808 parameters (shape from data/x.h5)"
  std::string comm;     // the comm model's source
  std::string profile;  // the machine profile's path, or "none"
  int64_t parameters = 0;
};

// The best `top` grids (those that fit first), each with its peak memory per rank, step time,
// throughput and reason; the ones that do not fit marked with their shortfall; the best
// grid's memory and time broken down; the assumptions.
std::string plan_text(const PlanResult& r, const PlanRequest& req, const PlanHeader& h, int top);
// Every grid: its keys as config keys, fits, the memory breakdown and peak, the step time's
// parts, throughput and reason.
std::string plan_json(const PlanResult& r, const PlanRequest& req, const PlanHeader& h);
// The `plan:` line of `strata train --parallel.auto`: the grid taken and why.
std::string auto_plan_line(const PlanResult& r, const PlanRequest& req);

}  // namespace strata
