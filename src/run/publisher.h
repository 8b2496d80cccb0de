// What a training run publishes, and the rule that nothing non-finite ever is: checkpoints
// (periodic, stop and final; gathered from every stage and tensor part on rank 0 when ranks
// hold parts of the model), their metrics events and warnings, and the count of writes that
// failed (the run then ends with kExitCheckpointsFailed).
#pragma once
#include <chrono>
#include <cstdint>

#include "base/metrics.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpointer.h"
#include "model/model.h"
#include "model/optim.h"
#include "parallel/grid.h"
#include "run/goodput.h"
#include "run/prometheus.h"
#include "run/run_plan.h"
#include "run/watchdog.h"
#include "strata/comm.h"

namespace strata {

// Where a finished checkpoint is reported besides the metrics file: the Prometheus file
// (its write) and the goodput ledger (the training thread's stall).
struct CheckpointReports {
  MetricsWriter* metrics;  // rank 0's; null elsewhere
  PrometheusFile& prom;
  GoodputLedger& goodput;
};

// The run's pieces a checkpoint is made of; `whole` and `whole_opt`: rank 0's assembly of the
// whole model when the plan gathers (null elsewhere).
struct PublishedState {
  Model& model;
  Optimizer& opt;
  Model* whole = nullptr;
  Optimizer* whole_opt = nullptr;
};

class Publisher {
 public:
  Publisher(const RunConfig& cfg, Comm& comm, const RunPlan& plan, const ProcessGrid& grid,
            Checkpointer& ckpt, PublishedState state, CheckpointReports reports,
            ProgressLine& progress, Watchdog& watchdog, Provenance prov, int64_t per_epoch,
            int64_t checkpoint_bytes, int64_t start_step);
  // Collective. The host copies of the parameters and optimizer state are finite on every
  // rank; else a 'diverged' event and exit 3 (the update after the last checked loss can
  // still make them NaN/Inf).
  void require_finite(int64_t steps_done);
  // Collective. A checkpoint after `steps_done` steps. wait = false (periodic ones): written
  // in the background when checkpoint.async; wait = true (stop and final ones): also in
  // checkpoint.dir on return when a node-local cache takes it first. Returns whether it was
  // written (or started).
  bool save(int64_t steps_done, bool wait);
  // Rank 0: reports a background write that has finished, if any.
  void poll();
  // Rank 0: waits for a background write in flight, and for the node-local cache's copies to
  // checkpoint.dir, and reports them (the run's end: a failed copy counts as a failed write).
  void finish();
  // Collective: the number of writes that failed (rank 0 counts them).
  int64_t agree_failures();

  double seconds_since_checkpoint() const;  // the last one's, or the run's start
  int64_t last_step() const { return last_step_; }
  // Measured (a stop's: the write and the copy to checkpoint.dir), or a slow disk's estimate.
  double last_write_s() const { return write_s_; }
  double total_write_s() const { return total_write_s_; }

 private:
  void report(const Checkpointer::SaveResult& r);
  bool finish_save(const Checkpointer::SaveResult& r, int64_t steps_done, bool waited,
                   std::chrono::steady_clock::time_point t_save);

  const RunConfig& cfg_;
  Comm& comm_;
  const RunPlan& plan_;
  const ProcessGrid& grid_;
  Checkpointer& ckpt_;
  PublishedState st_;
  MetricsWriter* metrics_;
  PrometheusFile& prom_;
  GoodputLedger& goodput_;
  ProgressLine& progress_;
  Watchdog& watchdog_;
  Provenance prov_;
  int64_t per_epoch_;
  bool lead_;
  double write_s_, total_write_s_ = 0;
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
  int64_t last_step_;
  int64_t failures_ = 0;
};

}  // namespace strata
