// What a training run needs in memory per rank, from its plan alone (nothing allocated): the
// one estimate the start-up report prints before the model is built, and what a planner of
// grids can call for any grid. Host memory on the CPU backend; on a GPU the same parts are
// device memory (bf16 copies and the device libraries' workspaces not counted).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/layer_stack.h"
#include "parallel/pipeline_schedule.h"
#include "run/run_plan.h"

namespace strata {

// The model's parameter count: what the layers use, and what they allocate (the token table's
// padding rows, model.pad_vocab, counted in `allocated` only).
struct ParameterCount {
  int64_t used = 0, allocated = 0;
};
ParameterCount count_parameters(const std::vector<LayerInfo>& layers);

// One rank's share of a run, in the terms the estimate needs.
struct RankShape {
  std::vector<LayerRange> chunks;  // the layers this rank's stage holds
  int tensor_parts = 1;            // T: blocks split this many ways
  int replicas = 1;                // D: ZeRO shards over them
  int zero = 0;                    // parallel.zero
  int optimizer_states = 1;        // floats per parameter: sgd 1 (momentum), adamw 2
  int64_t micro_batch = 1;         // samples per micro-batch
  int live_microbatches = 1;       // most micro-batches (chunk-micro-batches) alive at once
  bool recompute = false;          // blocks keep only their input (train.recompute = block)
  bool last_stage = true;          // holds the loss: logits' softmax and gradient
  bool tied_copy = false;          // holds a copy of the token table (the head's stage, P > 1)
  bool whole_model = false;        // rank 0 of a gathered grid: the whole model and its state
  int64_t classes = 0, rows_per_sample = 1;
  // A pipeline stage's receive buffers per live micro-batch (pipeline.cpp's slots): the
  // activation from the stage before (all but the first stage) and the gradient from the
  // stage after (all but the last), floats per sample.
  int64_t received_input = 0, received_gradient = 0;
};

// Bytes, by part.
struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer = 0;
  double activations = 0;  // kept from forward for backward, and backward's gradients
  double workspace = 0;    // the blocks' shared scratch, the loss's buffers, the runtime itself
  // A pipeline stage's receive buffers for its live micro-batches; with data parallelism on
  // MPI, the gradient buckets' temporary buffers while they are summed.
  double communication = 0;
  double whole_model = 0;  // rank 0 of a gathered grid: the model and its state gathered there
  double total() const {
    return parameters + gradients + optimizer + activations + workspace + communication + whole_model;
  }
};

// The process itself before any model: code, the MPI, HDF5 and oneDNN libraries, threads'
// stacks, the data loader's buffers (measured: benchmarks/bench_preset_memory.py).
inline constexpr double kRuntimeBytes = 50e6;

MemoryEstimate estimate_rank_memory(const std::vector<LayerInfo>& layers, const RankShape& r);

// The rank that needs the most on the planned grid (rank 0 when it gathers the whole model),
// and its estimate.
struct PlannedMemory {
  int stage = 0;
  MemoryEstimate estimate;
};
PlannedMemory estimate_run_memory(const RunConfig& cfg, const RunPlan& plan);
// The same with the schedule's theory already computed (a planner of many grids shares it);
// device_only: the rank whose device memory needs the most (the gathered whole model is host
// memory on a GPU, so left out).
PlannedMemory estimate_run_memory(const RunConfig& cfg, const RunPlan& plan,
                                  const ScheduleTheory& theory, bool device_only = false);

// "124,439,808 parameters (124,475,904 allocated: the token table padded to 50,304 rows);
// memory per rank ~3.10 GB (stage 0): parameters 0.50 + gradients 0.50 + ..." for the log.
std::string describe_memory(const ParameterCount& n, const PlannedMemory& m, const RunPlan& plan);
std::string thousands(int64_t n);  // 124439808 -> "124,439,808"
// The start-up report's `plan:` line (and `strata train --dry_run`'s): the parameter count
// and the estimate for the planned grid.
std::string plan_line(const RunConfig& cfg, const RunPlan& plan);

}  // namespace strata
