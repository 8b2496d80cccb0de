// A training run on this rank: set up once (TrainingSession's constructor: the agreed run
// plan, the process grid, the model and optimizer, the outputs and checkpoints, the resume),
// then the loop (run()), which reads like this:
//
//     for each step:  hooks.begin(step)            watchdog mark, trace window
//                     loss = step.compute(batch)   forward [+ backward + allreduce]
//                     agree(loss, hooks' votes)    one allreduce: loss, stop, checkpoint
//                     step.update(step)            [backward + allreduce] + optimizer
//                     hooks.end(...)               goodput, stop, checkpoints, metrics,
//                                                  Prometheus file
//
// and the end of the run (the final checkpoint, evaluation and parameter file).
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "base/metrics.h"
#include "checkpoint/checkpointer.h"
#include "comm/trace.h"
#include "config/config.h"
#include "data/data.h"
#include "model/model.h"
#include "model/optim.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "run/evaluate.h"
#include "run/goodput.h"
#include "run/memory_state.h"
#include "run/prometheus.h"
#include "run/publisher.h"
#include "run/run_plan.h"
#include "run/step_hooks.h"
#include "run/train_step.h"
#include "run/watchdog.h"
#include "strata/comm.h"

namespace strata {

// Trains as configured; returns an exit code (kExitOk, kExitDiverged, kExitResumable, ...).
// Throws UserError for bad input, after every rank agreed on it (no rank is left waiting in a
// collective).
int run_train(const RunConfig& cfg, Comm& comm);

class TrainingSession {
 public:
  // Collective. Throws UserError (agreed by every rank) for what cannot run.
  TrainingSession(const RunConfig& cfg, Comm& comm);
  int run();

 private:
  using Clock = std::chrono::steady_clock;
  void build_model();
  void make_whole();  // whole_ and whole_opt_
  void resume();
  std::optional<int> train_step(int64_t step);
  int finish_run(Clock::time_point t_start, double cpu_start);

  const RunConfig& cfg_;
  Comm& comm_;
  const bool lead_;
  RunPlan plan_;
  const Backend& be_;
  ProcessGrid grid_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<MetricsWriter> metrics_;
  PrometheusFile prom_;  // rank 0's, when output.prometheus is set
  std::unique_ptr<Loader> loader_;
  int64_t per_epoch_ = 1, total_ = 0, start_step_ = 0;
  OptimConfig oc_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<int64_t> shards_;  // ZeRO: each replica's shard size of the stage's flat buffer
  std::unique_ptr<Model> whole_;  // gathered runs: rank 0's assembly of every stage and part
  std::unique_ptr<Optimizer> whole_opt_;
  // After what it writes from (members are destroyed in reverse): its destructor waits for a
  // background write still in flight.
  std::unique_ptr<Checkpointer> ckpt_;
  TrafficGate gate_;  // closed by the gradient sums, waited on by mem_'s exchange: outlives it
  std::unique_ptr<MemoryState> mem_;  // checkpoint.memory_every
  std::string resumed_from_;          // "memory" | "file" | "" (from step 0)
  int64_t ckpt_bytes_ = 0;
  std::unique_ptr<GoodputLedger> goodput_;  // active on rank 0
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<ProgressLine> progress_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<GradientAllreducer> reducer_;
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<PipelineStage> pipe_;
  std::unique_ptr<TrainStep> step_;
  StepHooks hooks_;
  StopHook* stop_ = nullptr;        // owned by hooks_
  MetricsHook* metrics_hook_ = nullptr;
  double loader_wait_s_ = 0;
  DeviceAllocations allocs_at_step2_, allocs_at_end_;  // tensor.h's counter, steady state
  // Pipeline: the share of each step's wall time this rank waits for others (receives,
  // sends, the agreement), every step after the first: the measured bubble is its median
  // (robust to a step during which the machine took the CPU away).
  std::vector<double> idle_shares_;
};

}  // namespace strata
