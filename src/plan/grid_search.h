// The grids a config allows on a number of ranks, each with its predicted memory per rank and
// step time, ranked: what `strata plan` prints and `strata train --parallel.auto` takes.
//
// A grid is D x P x T = the ranks, a ZeRO stage, a pipeline schedule (with P > 1; interleaved
// with its virtual stages), micro-batches dividing the per-replica batch, recompute on or off
// (models with transformer blocks), and a precision (the config's; both fp32 and bf16 when the
// config leaves train.precision unset and the step-time model projects from a device's peak
// figures, which it has for both). Every candidate goes through the checks `strata train`
// makes (validate, grid_shape, the partition), so a grid offered here is one train runs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/comm_model.h"
#include "plan/machine_profile.h"
#include "plan/plan_memory.h"
#include "plan/step_time.h"

namespace strata {

struct PlanRequest {
  int nodes = 1, ranks_per_node = 1;
  RankMemory memory;  // what one rank may take
  bool gpu = false;   // T = 1 only (tensor parallelism runs on the CPU for now); device memory
  int ranks() const { return nodes * ranks_per_node; }
};

struct Candidate {
  GridChoice grid;
  PlanMemory memory;
  bool fits = false;
  double shortfall = 0;  // bytes over the rank's memory (0 when it fits)
  bool timed = false;    // a step time was predicted (a profile or a device to project from)
  StepTime time;
  double throughput = 0;  // samples (or tokens) per second; 0 untimed
  std::string reason;
};

struct PlanResult {
  std::vector<Candidate> candidates;  // those that fit first, best first; then by shortfall
  int refused = 0;                    // grids the config's checks refused (not listed)
  std::string unit = "samples/s";     // "tokens/s" for a language model
  double per_sample = 1;              // tokens per sample
  bool timed = false;
  std::vector<std::string> assumptions;
  const Candidate* best() const {
    return !candidates.empty() && candidates.front().fits ? &candidates.front() : nullptr;
  }
};

// The config with a grid's keys set (parallel.*, train.recompute, train.precision; explicit
// stage_layers dropped: a candidate's partition is balanced by cost).
RunConfig with_grid(RunConfig cfg, const GridChoice& g);
// Every grid, predicted and ranked. Without a profile and without a device in the comm model
// nothing is timed: the grids that fit are ranked by what costs time on any machine (fewer
// pipeline stages, then fewer tensor parts, no recompute, a lower ZeRO stage, fewer
// micro-batches), and the assumptions say so. Throws UserError when the profile does not fit
// the model (the step-time model's message).
PlanResult search_grids(const RunConfig& cfg, const PlanModel& model, const PlanRequest& req,
                        const MachineProfile& profile, const CommModel& comm);

// The one-line message for a config no grid fits: "no grid of 4 ranks fits 2.0 GB per rank
// (--memory_per_rank 2e9): the smallest needs 2.6 GB (D 1 x P 4 x T 1, ZeRO 2, recompute);
// give more ranks or memory". `where`: the config file, or "the config".
std::string no_fit_message(const PlanResult& r, const PlanRequest& req, const std::string& where);
// "D 2 x P 1 x T 1, ZeRO 0, 1f1b, 4 micro-batches, recompute, bf16"
std::string describe_grid(const GridChoice& g);

}  // namespace strata
