// The memory side of planning: the model a plan is made for (without a backend or a rank
// grid), each candidate grid's run plan as `strata train` would make it, and the memory a rank
// may take.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "data/data.h"
#include "model/layer_stack.h"
#include "parallel/pipeline_schedule.h"
#include "plan/step_time.h"
#include "run/memory_estimate.h"
#include "run/run_plan.h"

namespace strata {

// The model's layers and the data's shape (plan_model: from the dataset, or for a GPT whose
// vocabulary the config sets and whose data.path does not exist, from the config alone, so a
// plan can be made away from the data), with what the memory estimate needs besides.
struct PlanModel {
  DatasetInfo info;     // classes, tokens, sample shape: what RunPlan's estimate reads
  PlannedModel model;   // what the step-time model takes: the layers, the sample's shape
  int64_t rows_per_sample = 1;
  std::string source;
  bool has_blocks = false;  // transformer blocks: what train.recompute = "block" recomputes
};
// Throws UserError naming data.path when it cannot be read.
PlanModel describe_plan_model(const RunConfig& cfg);

// The bytes a rank may take, and what says so ("--memory_per_rank", "this node's 31.2 GiB
// (MemTotal) / 4 ranks per node").
struct RankMemory {
  double bytes = 0;
  std::string source;
};
// `given`: "auto" (or "") = node_memory_limit() divided by the ranks per node; else a byte
// count ("2e9", "2000000000"). Throws UserError naming `flag` for anything else.
RankMemory rank_memory(const std::string& given, int ranks_per_node, const std::string& flag);

// The run plan `strata train` would make of `cfg` on `ranks` ranks, without a backend or
// data: the grid's shape and the partition. Throws UserError as train's checks would.
RunPlan candidate_plan(const RunConfig& cfg, const PlanModel& m, int ranks);

// Peak memory of the rank that needs the most: on a GPU the device's (the whole model
// gathered for checkpoints is host memory there, left out).
struct PlanMemory {
  PlannedMemory planned;
  // checkpoint.memory_every: the rank's share of its node's memory directory (two generations
  // of its part, and of its partner's where parts have no replica on another node), and on a
  // GPU its two pinned staging buffers; host memory, in `peak` on the CPU only.
  double memory_checkpoints = 0;
  double peak = 0;  // what must fit in the rank's memory
};
// `nodes` x `ranks_per_node` ranks as Slurm fills nodes (consecutive ranks share one).
PlanMemory plan_memory(const RunConfig& cfg, const RunPlan& plan, const ScheduleTheory& theory, bool gpu,
                       int nodes = 1, int ranks_per_node = 1);

}  // namespace strata
