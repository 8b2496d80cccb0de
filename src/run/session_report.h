// What a training run reports: at its start, what runs where; at its end, each rank's memory
// (gathered) and rank 0's `done` event and line (session_report.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "config/config.h"
#include "model/model.h"
#include "model/optim.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "run/evaluate.h"
#include "run/goodput.h"
#include "run/run_plan.h"
#include "strata/comm.h"
#include "strata/tensor.h"

namespace strata {

// What rank 0 prints before the first step.
struct StartupReport {
  const RunConfig& cfg;
  const RunPlan& plan;
  const ProcessGrid& grid;
  const std::string& host;
  const std::optional<double>& end_time;  // the job's end (job.h), when known
  const std::string& model_summary;       // the whole model's, or this stage's
  int64_t per_epoch, total, buckets;      // steps per epoch, steps in all, allreduce buckets
  const Model& model;                     // this rank's share (its gradient buffer)
  const Optimizer& opt;                   // its state (a shard with ZeRO)
  bool periodic_checkpoints;
};
void print_startup(const StartupReport& r);

// What each rank holds of the training state (indexed by world rank), and its peak RSS.
struct RankMemory {
  std::vector<double> optimizer_state, gradients, gradient_sum, peak_rss_mb;
  // Device allocations and frees made by training steps after the second one (steady state:
  // none; tensor.h's counter, 0 on the CPU).
  std::vector<double> steady_device_allocs, steady_device_frees;
};

// Collective: bytes of optimizer state and gradients (the buffer backward writes, and the part
// of it that holds the replicas' sum after the step: the shard with ZeRO-2), the peak resident
// set (getrusage: the process's, so with thread ranks every rank reports the same) and the
// device allocations between the two counts.
RankMemory gather_rank_memory(Comm& comm, const Model& model, const Optimizer& opt, int zero,
                              const DeviceAllocations& at_step2, const DeviceAllocations& at_end);

// The figures of a finished run, as rank 0 reports them.
struct DoneReport {
  const RunConfig& cfg;
  const RunPlan& plan;
  int64_t step, steps_run;  // the last step, and how many this attempt ran
  double train_s, cpu_s;    // wall time of the loop, and the training thread's CPU time
  double checkpoint_write_s, allreduce_exposed_s, loader_wait_s;
  const EvalResult& ev;
  const PipelineFigures& figures;
  const GoodputFigures& goodput;
  const RankMemory& memory;
};

// Rank 0: the `done` event (to `metrics`, when there is a metrics file) and the `done:` line.
void report_done(const DoneReport& r, MetricsWriter* metrics);

}  // namespace strata
