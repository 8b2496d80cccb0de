#include "run/step_hooks.h"

#include <cmath>

#include <fmt/format.h>

#include "base/job.h"
#include "strata/error.h"

namespace strata {
namespace {

// The signal `count` ranks got, from the sum of their signal numbers: its name if they all
// got the same one, else "signals".
std::string signal_names(double sum, double count) {
  const int sig = int(std::lround(sum / count));
  return double(sig) * count == sum ? signal_name(sig) : "signals";
}

class WatchdogHook final : public StepHook {
 public:
  explicit WatchdogHook(Watchdog& w) : w_(w) {}
  void begin(int64_t step) override { w_.step_begin(step); }

 private:
  Watchdog& w_;
};

class TraceHook final : public StepHook {
 public:
  explicit TraceHook(Tracer& t) : t_(t) {}
  void begin(int64_t step) override { t_.begin_step(step); }

 private:
  Tracer& t_;
};

class CheckpointHook final : public StepHook {
 public:
  CheckpointHook(const CheckpointPolicy& policy, Comm& comm, Publisher& p)
      : policy_(policy), lead_(comm.rank() == 0), publisher_(p) {}
  void vote(Agreement& a) override {  // rank 0's clock decides the time rule for every rank
    if (lead_) a.checkpoint_due = policy_.time_due_by(publisher_.seconds_since_checkpoint()) ? 1.0 : 0.0;
  }
  std::optional<int> end(const StepEnd& e) override {
    if (policy_.due(e.step + 1, e.total, e.agreed.checkpoint_due > 0))
      publisher_.save(e.step + 1, /*wait=*/false);
    publisher_.poll();
    return std::nullopt;
  }

 private:
  const CheckpointPolicy& policy_;
  bool lead_;
  Publisher& publisher_;
};

class GoodputHook final : public StepHook {
 public:
  explicit GoodputHook(GoodputLedger& g) : g_(g) {}
  std::optional<int> end(const StepEnd& e) override {
    g_.step_done(e.step + 1, e.seconds);
    return std::nullopt;
  }

 private:
  GoodputLedger& g_;
};

class PrometheusHook final : public StepHook {
 public:
  PrometheusHook(PrometheusFile& prom, const MetricsHook& metrics, const GoodputLedger& goodput,
                 const Watchdog& watchdog, int64_t tokens_per_sample)
      : prom_(prom), metrics_(metrics), goodput_(goodput), watchdog_(watchdog),
        tokens_per_sample_(tokens_per_sample) {}
  std::optional<int> end(const StepEnd&) override {
    const auto& i = metrics_.logged();
    if (!prom_.active() || !i) return std::nullopt;
    prom_.write({.step = i->step, .loss = i->loss, .samples_per_s = i->samples_per_s,
                 .tokens_per_s = i->samples_per_s * double(tokens_per_sample_),
                 .step_s = i->step_s, .allreduce_exposed_s = i->allreduce_exposed_s,
                 .progress_age_s = watchdog_.active() ? watchdog_.progress_age_s() : -1.0,
                 .slurm_restart_count = slurm_restart_count(), .goodput = goodput_.figures()});
    return std::nullopt;
  }

 private:
  PrometheusFile& prom_;
  const MetricsHook& metrics_;
  const GoodputLedger& goodput_;
  const Watchdog& watchdog_;
  int64_t tokens_per_sample_;
};

}  // namespace

void Agreement::sum_over(Comm& comm) {
  double v[5] = {loss, signalled, time_limit, checkpoint_due, signal_sum};
  comm.allreduce_sum(v, 5);
  loss = v[0], signalled = v[1], time_limit = v[2], checkpoint_due = v[3], signal_sum = v[4];
}

void StepHooks::begin(int64_t step) {
  for (auto& h : hooks_) h->begin(step);
}

void StepHooks::vote(Agreement& a) {
  for (auto& h : hooks_) h->vote(a);
}

std::optional<int> StepHooks::end(const StepEnd& e) {
  for (auto& h : hooks_)
    if (auto code = h->end(e)) return code;
  return std::nullopt;
}

std::unique_ptr<StepHook> watchdog_hook(Watchdog& w) { return std::make_unique<WatchdogHook>(w); }
std::unique_ptr<StepHook> trace_hook(Tracer& t) { return std::make_unique<TraceHook>(t); }
std::unique_ptr<StepHook> checkpoint_hook(const CheckpointPolicy& policy, Comm& comm,
                                          Publisher& p) {
  return std::make_unique<CheckpointHook>(policy, comm, p);
}
std::unique_ptr<StepHook> goodput_hook(GoodputLedger& g) { return std::make_unique<GoodputHook>(g); }
std::unique_ptr<StepHook> prometheus_hook(PrometheusFile& prom, const MetricsHook& metrics,
                                          const GoodputLedger& goodput, const Watchdog& watchdog,
                                          int64_t tokens_per_sample) {
  return std::make_unique<PrometheusHook>(prom, metrics, goodput, watchdog, tokens_per_sample);
}

StopHook::StopHook(Comm& comm, Publisher& publisher, MetricsWriter* metrics,
                   ProgressLine& progress)
    : comm_(comm), publisher_(publisher), metrics_(metrics), progress_(progress) {
  if (comm.rank() != 0) return;
  std::string why_not;
  end_time_ = job_end_time(&why_not);
  if (!why_not.empty())
    fmt::print(stderr, "strata: warning: the job's time limit is unknown ({}); relying on "
               "the scheduler's signals\n", why_not);
}

void StopHook::vote(Agreement& a) {
  // Any rank that got a stop signal, and which (srun forwards the same one to every rank,
  // whichever got it first); rank 0 for the time limit.
  a.signalled = stop_signal() ? 1.0 : 0.0;
  a.signal_sum = double(stop_signal());
  if (comm_.rank() == 0)
    a.time_limit = end_time_ && unix_now() + margin() >= *end_time_ ? 1.0 : 0.0;
}

std::string StopHook::why(const Agreement& a) const {
  if (a.signalled > 0)
    return fmt::format("a stop signal ({} on {} of {} ranks)",
                       signal_names(a.signal_sum, a.signalled), a.signalled, comm_.size());
  return fmt::format("the job's time limit (ends {}, margin {:.0f} s)",
                     end_time_ ? local_clock_time(*end_time_) : "?", margin());
}

std::optional<int> StopHook::end(const StepEnd& e) {
  step_s_ = step_s_ == 0 ? e.seconds : 0.8 * step_s_ + 0.2 * e.seconds;
  if (!e.agreed.stop()) return std::nullopt;
  progress_.finish();
  const bool lead = comm_.rank() == 0;
  const int64_t done = e.step + 1;
  const std::string why = this->why(e.agreed);
  const bool ok = publisher_.save(done, /*wait=*/true);
  if (lead) {
    if (metrics_)
      metrics_->write({{"event", json_string("stopped")}, {"step", fmt::format("{}", done)},
                       {"checkpoint_written", ok ? "true" : "false"}});
    if (ok)
      fmt::print("stopped after step {} for {}: checkpoint written; exit {} (resumable)\n", done,
                 why, int(kExitResumable));
  }
  if (!ok) {
    if (lead)
      fmt::print(stderr, "strata: error: stopped after step {} for {} but the checkpoint "
                 "could not be written; the previous one is intact\n", done, why);
    return kExitInternal;
  }
  return kExitResumable;
}

MetricsHook::MetricsHook(const RunConfig& cfg, const OptimConfig& oc, int64_t per_epoch,
                         MetricsWriter* metrics, ProgressLine& progress,
                         GradientAllreducer& reducer)
    : cfg_(cfg), oc_(oc), per_epoch_(per_epoch), metrics_(metrics), progress_(progress),
      reducer_(reducer) {}

std::optional<int> MetricsHook::end(const StepEnd& e) {
  samples_since_log_ += cfg_.train.batch_size;
  logged_.reset();
  const int64_t step = e.step, total = e.total;
  const bool last = step + 1 == total;
  if ((step + 1) % cfg_.train.log_every != 0 && !last) return std::nullopt;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const double dt = since(last_log_), elapsed = since(start_);
  const double sps = double(samples_since_log_) / std::max(dt, 1e-9);
  const double eta = elapsed / double(step + 1) * double(total - step - 1);
  const double steps = double(samples_since_log_) / double(cfg_.train.batch_size);
  exposed_s_ += reducer_.stats().exposed_s;
  logged_ = LogInterval{.step = step + 1, .loss = e.loss, .samples_per_s = sps,
                        .step_s = dt / steps, .allreduce_exposed_s = reducer_.stats().exposed_s / steps};
  if (metrics_)
    metrics_->write({{"step", fmt::format("{}", step + 1)},
                     {"epoch", json_number(double(step + 1) / double(per_epoch_))},
                     {"loss", json_number(e.loss)},
                     {"lr", json_number(lr_at(oc_, step))},
                     {"samples_per_s", json_number(sps)},
                     {"time_s", json_number(elapsed)}});
  progress_.update(fmt::format("epoch {}/{}  step {}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}",
                               step / per_epoch_ + 1, cfg_.train.epochs, step + 1, total, e.loss,
                               sps, format_duration(eta)),
                   /*force_newline=*/last || !progress_.in_place());
  reducer_.reset_stats();
  last_log_ = Clock::now();
  samples_since_log_ = 0;
  return std::nullopt;
}

}  // namespace strata
