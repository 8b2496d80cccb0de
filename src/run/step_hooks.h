// What runs at a training step's boundaries besides its arithmetic, as hooks the loop calls
// (the way LBANN's callbacks hang off its training loop): watchdog marks and tracing when a
// step begins; a vote in the per-step agreement; checkpoints, stops and metrics when it ends.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "checkpoint/policy.h"
#include "comm/trace.h"
#include "config/config.h"
#include "model/optim.h"
#include "parallel/data_parallel.h"
#include "run/goodput.h"
#include "run/prometheus.h"
#include "run/publisher.h"
#include "run/watchdog.h"
#include "strata/comm.h"

namespace strata {

// What every rank agrees on after each step's compute, in one allreduce: the loss (before the
// update, so a diverged step changes no parameter) and whether to stop or checkpoint after it.
// Each field is a sum over ranks.
struct Agreement {
  double loss = 0;            // per-row losses (a tensor group's part 0 counts)
  double signalled = 0;       // ranks that got a stop signal
  double signal_sum = 0;      // their signal numbers (the signal's name, when all got the same)
  double time_limit = 0;      // rank 0: the job's end is near
  double checkpoint_due = 0;  // rank 0: checkpoint.every_seconds have passed
  bool stop() const { return signalled > 0 || time_limit > 0; }
  void sum_over(Comm& comm);
};

struct StepEnd {
  int64_t step;             // 0-based index of the step just done
  int64_t total;            // steps in the run
  double loss;              // the agreed mean loss per row
  const Agreement& agreed;
  double seconds;           // this step's wall time
};

class StepHook {
 public:
  virtual ~StepHook() = default;
  virtual void begin(int64_t step) {}
  virtual void vote(Agreement&) {}
  // After the update. An exit code ends the run at once (a stop).
  virtual std::optional<int> end(const StepEnd&) { return std::nullopt; }
};

class StepHooks {
 public:
  void add(std::unique_ptr<StepHook> h) { hooks_.push_back(std::move(h)); }
  void begin(int64_t step);
  void vote(Agreement& a);
  std::optional<int> end(const StepEnd& e);

 private:
  std::vector<std::unique_ptr<StepHook>> hooks_;
};

// The watchdog's progress mark and the tracer's step window.
std::unique_ptr<StepHook> watchdog_hook(Watchdog& watchdog);
std::unique_ptr<StepHook> trace_hook(Tracer& tracer);

// Stops: a signal on any rank, or the job's end time (rank 0 watches it: $STRATA_JOB_END_TIME
// or squeue) closer than a margin of 10 s + twice the last checkpoint write + three steps
// (the stop is agreed a step ahead). After the step: a checkpoint, then exit 75
// (kExitResumable), or 1 if it could not be written.
class StopHook final : public StepHook {
 public:
  // Rank 0 reads the job's end time (a warning when it cannot be known).
  StopHook(Comm& comm, Publisher& publisher, MetricsWriter* metrics, ProgressLine& progress);
  void vote(Agreement& a) override;
  std::optional<int> end(const StepEnd& e) override;
  const std::optional<double>& end_time() const { return end_time_; }

 private:
  double margin() const { return 10 + 2 * publisher_.last_write_s() + 3 * step_s_; }
  std::string why(const Agreement& a) const;
  Comm& comm_;
  Publisher& publisher_;
  MetricsWriter* metrics_;
  ProgressLine& progress_;
  std::optional<double> end_time_;
  double step_s_ = 0;  // a moving average of the step time
};

// Periodic checkpoints (checkpoint.every_steps, every_seconds) and reports of background
// writes that finished.
// Saves each periodic checkpoint `policy` makes due (policy.h).
std::unique_ptr<StepHook> checkpoint_hook(const CheckpointPolicy& policy, Comm& comm,
                                          Publisher& publisher);

// What a log interval measured, for the hooks after MetricsHook (per step: means over it).
struct LogInterval {
  int64_t step = 0;  // steps done at its end
  double loss = 0, samples_per_s = 0, step_s = 0, allreduce_exposed_s = 0;
};

// Every train.log_every steps and at the last: a metrics line and the progress line.
class MetricsHook final : public StepHook {
 public:
  MetricsHook(const RunConfig& cfg, const OptimConfig& oc, int64_t per_epoch,
              MetricsWriter* metrics, ProgressLine& progress, GradientAllreducer& reducer);
  std::optional<int> end(const StepEnd& e) override;
  double allreduce_exposed_s() const { return exposed_s_; }
  // The interval that ended at this step, if one did.
  const std::optional<LogInterval>& logged() const { return logged_; }

 private:
  using Clock = std::chrono::steady_clock;
  const RunConfig& cfg_;
  const OptimConfig& oc_;
  int64_t per_epoch_;
  MetricsWriter* metrics_;
  ProgressLine& progress_;
  GradientAllreducer& reducer_;
  Clock::time_point start_ = Clock::now(), last_log_ = start_;
  int64_t samples_since_log_ = 0;
  double exposed_s_ = 0;
  std::optional<LogInterval> logged_;
};

// The goodput ledger's step time (add it before the stop hook: a stop's step counts too).
std::unique_ptr<StepHook> goodput_hook(GoodputLedger& goodput);

// After each log interval (add it after MetricsHook): rank 0 rewrites the Prometheus file.
// `tokens_per_sample`: a language model's positions per sample, 0 for a classifier.
std::unique_ptr<StepHook> prometheus_hook(PrometheusFile& prom, const MetricsHook& metrics,
                                          const GoodputLedger& goodput, const Watchdog& watchdog,
                                          int64_t tokens_per_sample);

}  // namespace strata
