#include "run/divergence.h"
#include "run/publisher.h"

#include <climits>

#include <fmt/format.h>

#include "base/job.h"
#include "parallel/whole_model.h"
#include "parallel/zero.h"
#include "strata/error.h"

namespace strata {
namespace {

bool all_finite(const float* p, int64_t n) {
  float acc = 0;  // NaN and Inf survive a product with zero; finite values give zero
  for (int64_t i = 0; i < n; ++i) acc += p[i] * 0.0f;
  return acc == 0.0f;
}

}  // namespace

Publisher::Publisher(const RunConfig& cfg, Comm& comm, const RunPlan& plan,
                     const ProcessGrid& grid, Checkpointer& ckpt, PublishedState state,
                     CheckpointReports reports, ProgressLine& progress, Watchdog& watchdog,
                     Provenance prov, int64_t per_epoch, int64_t checkpoint_bytes,
                     int64_t start_step)
    : cfg_(cfg), comm_(comm), plan_(plan), grid_(grid), ckpt_(ckpt), st_(state),
      metrics_(reports.metrics), prom_(reports.prom), goodput_(reports.goodput),
      progress_(progress), watchdog_(watchdog), prov_(std::move(prov)),
      per_epoch_(per_epoch), lead_(comm.rank() == 0),
      write_s_(double(checkpoint_bytes) / 50e6),  // until measured: a slow disk's 50 MB/s
      last_step_(start_step) {}

void Publisher::require_finite(int64_t steps_done) {
  bool finite = all_finite(st_.model.host_values().data(), st_.model.host_values().size());
  for (auto& [name, t] : st_.opt.state()) finite = finite && all_finite(t->data(), t->size());
  int64_t first_bad = finite ? INT_MAX : comm_.rank();
  comm_.allreduce_min(&first_bad, 1);
  if (first_bad == INT_MAX) return;
  progress_.finish();
  report_divergence({.step = steps_done,
                     .what = "the update made parameters or optimizer state NaN/Inf",
                     .field = "loss", .value = "null", .not_written = "nothing was written"},
                    comm_.rank() == first_bad, metrics_);
}

bool Publisher::save(int64_t steps_done, bool wait) {
  const auto t_save = std::chrono::steady_clock::now();
  Watchdog::Exempt exempt(watchdog_, "writing a checkpoint");
  prov_.created_utc = utc_now_iso();
  TrainState st{.step = steps_done, .epoch = steps_done / per_epoch_,
                .batch = steps_done % per_epoch_, .global_batch = cfg_.train.batch_size,
                .seed = cfg_.train.seed, .optimizer = cfg_.train.optimizer,
                .optimizer_steps = st_.opt.steps_taken()};
  const bool durable = wait;
  wait = wait || !cfg_.checkpoint.async;
  if (lead_)
    if (auto prev = ckpt_.finish()) report(*prev);
  const Backend& be = *plan_.be;
  st_.model.pull(be);  // checkpoints are written from the host copies
  st_.opt.pull(be);
  require_finite(steps_done);
  auto prepared = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_save).count();
  };
  if (ckpt_.writer().every_rank_writes()) {
    auto r = ckpt_.save_every_rank(st_.model, st_.opt, st, prov_, prepared());
    return finish_save(r, steps_done, true, t_save);
  }
  // ZeRO: replica 0 of the stage assembles the stage's whole optimizer state first (the other
  // replicas' state is not read after this).
  std::unique_ptr<Optimizer> assembled;
  if (st_.opt.sharded())
    assembled = gather_shards(comm_, grid_, st_.opt, zero_counts(st_.model, grid_.replicas));
  Optimizer& opt = assembled ? *assembled : st_.opt;
  const bool gathered = plan_.gathered();
  if (gathered)
    gather_stages(comm_, grid_, plan_.layers, plan_.ranges, st_.model, opt, st_.whole,
                  st_.whole_opt);
  auto r = gathered && lead_
               ? ckpt_.save(*st_.whole, *st_.whole_opt, st, prov_, wait, durable, prepared())
               : ckpt_.save(st_.model, opt, st, prov_, wait, durable, prepared());
  return finish_save(r, steps_done, wait, t_save);
}

bool Publisher::finish_save(const Checkpointer::SaveResult& r, int64_t steps_done, bool waited,
                            std::chrono::steady_clock::time_point t_save) {
  last_time_ = std::chrono::steady_clock::now();
  last_step_ = steps_done;
  if (waited) report(r);
  goodput_.checkpoint(steps_done,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_save).count());
  return r.ok;
}

void Publisher::poll() {
  if (lead_)
    if (auto r = ckpt_.poll()) report(*r);
}

void Publisher::finish() {
  if (!lead_) return;
  Watchdog::Exempt exempt(watchdog_, "finishing a checkpoint write");
  if (auto r = ckpt_.finish(/*copies=*/true)) report(*r);
}

int64_t Publisher::agree_failures() {
  int64_t n = failures_;
  comm_.broadcast(&n, sizeof n, 0);
  return n;
}

double Publisher::seconds_since_checkpoint() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_time_).count();
}

// A finished write: its metrics event, or a warning. A failed write leaves the earlier
// checkpoints intact and training goes on; the run ends with kExitCheckpointsFailed.
void Publisher::report(const Checkpointer::SaveResult& r) {
  if (r.ok) {
    write_s_ = r.seconds + r.copy_s;  // a stop checkpoint must reach checkpoint.dir
    total_write_s_ += r.seconds;
    prom_.note_checkpoint(r.step, r.seconds, r.stall_s, r.bytes);
    if (metrics_)
      metrics_->write({{"event", json_string("checkpoint")}, {"step", fmt::format("{}", r.step)},
                       {"path", json_string(r.path)}, {"bytes", fmt::format("{}", r.bytes)},
                       {"write_s", json_number(r.seconds)}, {"stall_s", json_number(r.stall_s)},
                       {"mb_per_s", json_number(double(r.bytes) / 1e6 / std::max(r.seconds, 1e-9))}});
  }
  if (!r.ok) ++failures_;
  if (lead_ && !r.error.empty())
    fmt::print(stderr, "strata: warning: checkpoint at step {}: {}\n", r.step, r.error);
}

}  // namespace strata
