// The step-time model: one training step's seconds for a grid (data x pipeline x tensor
// parallelism, ZeRO stage, schedule, micro-batches, recompute) on a machine, from its layer
// profile (machine_profile.h) and its communication model (comm_model.h), with each part
// named so the planner can say why one grid beats another.
//
// What it models is what strata does (docs/planning.md "The step-time model"):
//   compute    each stage's layers (the partition training makes) at the micro-batch size
//              G / D / M, interpolated from the profile; tensor-parallel blocks' compute over T
//              plus their 2 forward and 2 backward allreduces of (micro-batch x context x dim)
//              floats; recompute = block adds a block forward to each block backward
//   bubble     the schedule simulated with those costs (parallel/pipeline_schedule.h: simulate_schedule) and the activation
//              sends between stages from the comm model: the span less the busiest stage's work
//   exposed communication  the data-parallel gradient sums as data_parallel.cpp runs them:
//              buckets started as backward finishes them, waited for after it (overlap = true;
//              without a pipeline only the last micro-batch's backward overlaps), ZeRO-1/2 a
//              reduce-scatter instead and the parameter all-gather after the optimizer
//   optimizer  the profile's per-layer update time, over D with ZeRO
//   checkpoint the model state at the profile's write bandwidth, once per checkpoint.every_steps
//   CPU oversubscription: ranks_per_node x threads_per_rank over the node's cores slows every
//              rank's compute by that ratio; a pipeline on one such node is simulated with its
//              stages sharing the cores instead (an idle stage's share goes to the others)
//   busy node  a rank's compute slower by the profile's busy-node slowdown (the whole pass with
//              a node's ranks at once over alone: shared caches, memory bandwidth, clocks),
//              in proportion to the grid's other ranks on the node
//   input      the step's batch from the loader (and its copy to a device), once a step before
//              the first forward, from the profile's measurement of the config's data
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/data.h"
#include "model/layer_stack.h"
#include "plan/comm_model.h"
#include "plan/machine_profile.h"

namespace strata {

struct GridChoice {
  int data = 1, pipeline = 1, tensor = 1, zero = 0;
  std::string schedule = "1f1b";
  int micro_batches = 1, virtual_stages = 1;
  bool recompute = false;
  std::string precision = "fp32";
  int ranks_per_node = 1;
  int threads_per_rank = 1;
  int ranks() const { return data * pipeline * tensor; }
};

struct StepTime {
  double total_s = 0;
  double compute_s = 0;         // the busiest stage's forward and backward work
  double bubble_s = 0;          // the pipeline's idle time beyond that (and its sends)
  double exposed_comm_s = 0;    // data-parallel sums and ZeRO gathers not hidden by backward
  double checkpoint_s = 0;      // checkpoint stall, averaged per step
  double optimizer_s = 0;
  double tensor_comm_s = 0;     // tensor-parallel allreduces (inside compute_s)
  double micro_batch = 0;       // samples per micro-batch: G / D / M
  double oversubscription = 1;  // compute slowdown from more threads than cores
  double busy_node = 1;         // compute slowdown from the node's other ranks computing too
  bool shared_cores = false;    // oversubscribed, the pipeline's stages simulated sharing the cores
  std::string reason;           // "P = 4 pays a 9 % bubble; T = 2 pays 2 allreduces per block ..."
  std::vector<std::string> assumptions;  // what the figures rest on, one line each
};

// The model a prediction is for: its whole layer list (layer_stack.h) and the sample's shape.
struct PlannedModel {
  Shape input;
  int classes = 0;
  std::vector<LayerInfo> layers;
  int64_t tokens_per_sample = 1;  // a language model's context, else 1
};
// The training data as training opens it (token files cut into windows of model.context);
// none for a GPT preset with no data file. Throws UserError naming the file/key.
std::optional<DatasetInfo> planned_dataset(const RunConfig& cfg);
// Reads the dataset's shape from cfg.data.path as training does; a GPT whose model.vocab and
// model.context are set (a preset) needs no data file. Throws UserError naming the file/key.
PlannedModel plan_model(const RunConfig& cfg);

// Throws UserError when the grid cannot run this config (the partition's own messages) and
// when the profile holds no figure for a layer and the comm model no device to project from.
StepTime predict_step_time(const RunConfig& cfg, const PlannedModel& model, const GridChoice& g,
                           const MachineProfile& layers, const CommModel& comm);
// The same, describing the model first (plan_model).
StepTime predict_step_time(const RunConfig& cfg, const GridChoice& g, const MachineProfile& layers,
                           const CommModel& comm);

}  // namespace strata
