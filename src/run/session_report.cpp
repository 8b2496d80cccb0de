// What rank 0 prints at the start of a run (what runs where) and at its end (the `done` event
// and line).
#include <sys/resource.h>

#include <algorithm>

#include <fmt/format.h>

#include "base/job.h"
#include "parallel/pipeline_schedule.h"
#include "run/session.h"
#include "run/session_report.h"
#include "strata/version.h"

namespace strata {
namespace {

// The pipeline: its shape, partition, and which ranks and hosts hold each stage.
void print_pipeline(const RunConfig& cfg, const RunPlan& p, const ProcessGrid& grid,
                    const std::string& host) {
  const int P = p.P, D = p.D;
  // The schedule in theory: its mean idle share with F, B and W costing the same, and the
  // most micro-batches a stage holds.
  const ScheduleTheory theory = schedule_theory(cfg.parallel.schedule, P, p.M, p.v);
  const double bubble = theory.bubble;
  const int live = *std::max_element(theory.live.begin(), theory.live.end());
  fmt::print("pipeline: {} stage{} x {} data-parallel replica{} ({}), {} micro-batches of {} "
             "per step, schedule {}{} (bubble {:.3f} in theory, at most {} {}micro-batch{} alive "
             "on a stage), partition {}\n{}\n", P, P == 1 ? "" : "s", D,
             D == 1 ? "" : "s", cfg.parallel.placement, p.M, p.micro_batch(cfg.train.batch_size),
             cfg.parallel.schedule, p.v > 1 ? fmt::format(" with {} chunks per stage", p.v) : "",
             bubble, live, p.v > 1 ? "chunk-" : "", live == 1 ? "" : "es",
             !cfg.parallel.stage_layers.empty() ? "parallel.stage_layers" : cfg.parallel.balance,
             partition_summary(p.layers, p.costs, p.ranges, P));
  for (int st = 0; st < P; ++st) {
    std::string where;
    for (int r = 0; r < D; ++r) {
      const int w = grid.world_rank(st, r);
      where += fmt::format("{}rank {} ({})", r ? ", " : "", w, grid.hosts[size_t(w)]);
    }
    fmt::print("  stage {} on {}\n", st, where);
  }
  if (grid.oversubscribed)
    fmt::print("note: {} ranks x {} thread{} share {} cores on {}: ranks waiting for a "
               "neighbour sleep between polls; timings are not those of a core per rank\n",
               grid.node_ranks, cfg.threads, cfg.threads == 1 ? "" : "s", grid.node_cores, host);
}

// What activation recomputation trades: the blocks' internal activations per micro-batch.
void print_recompute(const RunConfig& cfg, const RunPlan& p) {
  int blocks = 0, recomputed = 0;
  int64_t block_bytes = 0, recomputed_bytes = 0;
  for (const auto& l : p.layers) {
    if (l.internal_bytes == 0) continue;
    ++blocks;
    block_bytes += l.internal_bytes;
    if (l.recomputes) ++recomputed, recomputed_bytes += l.internal_bytes;
  }
  if (recomputed == 0) return;
  const double mib = double(p.micro_batch(cfg.train.batch_size)) / 1048576.0 / p.T;
  fmt::print("recompute: {} of {} blocks recompute their activations in backward: {:.1f} of "
             "{:.1f} MiB per micro-batch not kept (per rank: split over the stages{}), one "
             "block's set alive at a time instead\n", recomputed, blocks,
             double(recomputed_bytes) * mib, double(block_bytes) * mib,
             p.T > 1 ? " and, roughly, the tensor parts" : "");
}

}  // namespace

void print_startup(const StartupReport& r) {
  const RunConfig& cfg = r.cfg;
  const RunPlan& p = r.plan;
  const DatasetInfo& info = p.info;
  if (const auto& end = r.end_time)
    fmt::print("job ends at {}; strata stops with a checkpoint before then (margin measured from "
               "its checkpoint writes)\n", local_clock_time(*end));
  fmt::print("strata {} ({}): {} rank{}, device {}\n", STRATA_VERSION, git_commit(),
             p.ranks, p.ranks == 1 ? "" : "s", p.device_note);
  if (!p.shared_gpus.empty())
    fmt::print(stderr, "strata: warning: {}: their gradient sums go through host memory (NCCL "
               "needs a GPU per rank); give each rank its own GPU (srun --gpus-per-task=1, or as "
               "many ranks per node as GPUs)\n", p.shared_gpus);
  const std::string shards =
      info.train.files.empty() ? "" : fmt::format(" ({} token shards: {} train file{}, {} val)",
                                                  info.format, info.train.files.size(),
                                                  info.train.files.size() == 1 ? "" : "s",
                                                  info.test.files.size());
  fmt::print("data {}{}: {} train samples{}, {} classes, sample shape {}\n", cfg.data.path, shards,
             info.train.n, info.has_test ? fmt::format(", {} test", info.test.n) : "",
             info.classes, shape_str(info.train.sample_shape));
  fmt::print("model:\n{}\n", r.model_summary);
  if (p.T > 1)
    fmt::print("tensor parallel: {} ranks split each block ({} of {} heads and {} of {} MLP "
               "units each) x {} pipeline stage{} x {} data-parallel replica{}\n", p.T,
               cfg.model.heads / p.T, cfg.model.heads, 4 * cfg.model.dim / p.T,
               4 * cfg.model.dim, p.P, p.P == 1 ? "" : "s", p.D, p.D == 1 ? "" : "s");
  if (p.pipelined()) print_pipeline(cfg, p, r.grid, r.host);
  const std::string span =
      r.total < r.per_epoch * cfg.train.epochs
          ? fmt::format("train.max_steps; an epoch is {} steps", r.per_epoch)
          : fmt::format("{} epoch{} of {} steps", cfg.train.epochs,
                        cfg.train.epochs == 1 ? "" : "s", r.per_epoch);
  const int64_t buckets = r.buckets;
  fmt::print("training {} steps ({}), global batch {} ({} per replica), {} allreduce bucket{}\n",
             r.total, span, cfg.train.batch_size, cfg.train.batch_size / p.D, buckets,
             buckets == 1 ? "" : "s");
  print_recompute(cfg, p);
  // What each rank holds of the training state (rank 0's; the others' differ by a shard's
  // alignment at most).
  const double grads_mb = double(r.model.grads().size()) * 4 / 1e6;
  const double shard_mb = double(r.opt.shard().end - r.opt.shard().begin) * 4 / 1e6;
  fmt::print("per rank: optimizer state {:.1f} MB{}, gradients {:.1f} MB{}\n",
             double(r.opt.state_bytes()) / 1e6,
             cfg.parallel.zero ? fmt::format(" (ZeRO-{}: 1/{} of the stage's)", cfg.parallel.zero, p.D) : "",
             grads_mb,
             cfg.parallel.zero == 2 ? fmt::format(", reduce-scattered: the sum kept {:.1f} MB", shard_mb)
                                    : "");
  if (p.writer.kind == CheckpointWriterKind::kParallel && r.periodic_checkpoints)
    fmt::print("checkpoints: {}\n", p.writer.why);
  std::fflush(stdout);
}

// Bytes of optimizer state and gradients (the buffer backward writes, and the part of it that
// holds the replicas' sum after the step: the shard with ZeRO-2), and the peak resident set
// (getrusage: the process's, so with thread ranks every rank reports the same).
RankMemory gather_rank_memory(Comm& comm, const Model& model, const Optimizer& opt, int zero,
                              const DeviceAllocations& at_step2,
                              const DeviceAllocations& at_end) {
  const int n = comm.size(), me = comm.rank();
  std::vector<double> v(size_t(6 * n), 0.0);
  const double grads = double(model.grads().size()) * sizeof(float);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  v[size_t(me)] = double(opt.state_bytes());
  v[size_t(n + me)] = grads;
  v[size_t(2 * n + me)] =
      zero == 2 ? double(opt.shard().end - opt.shard().begin) * sizeof(float) : grads;
  v[size_t(3 * n + me)] = double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
  v[size_t(4 * n + me)] = double(at_end.allocs - at_step2.allocs);
  v[size_t(5 * n + me)] = double(at_end.frees - at_step2.frees);
  comm.allreduce_sum(v.data(), int64_t(v.size()));
  auto part = [&](int k) { return std::vector<double>(v.begin() + k * n, v.begin() + (k + 1) * n); };
  return {part(0), part(1), part(2), part(3), part(4), part(5)};
}

void report_done(const DoneReport& r, MetricsWriter* metrics) {
  const RunConfig& cfg = r.cfg;
  const RunPlan& p = r.plan;
  const DatasetInfo& info = p.info;
  const EvalResult& ev = r.ev;
  const PipelineFigures& figures = r.figures;
  const RankMemory& memory = r.memory;
  const double train_s = r.train_s;
  const int64_t steps_run = r.steps_run;
  const double sps = double(steps_run) * double(cfg.train.batch_size) / std::max(train_s, 1e-9);
  std::vector<MetricsWriter::Field> done = {
      {"event", json_string("done")}, {"step", fmt::format("{}", r.step)},
      {"train_time_s", json_number(train_s)},
      {"samples_per_s", json_number(sps)},
      {"checkpoint_write_s", json_number(r.checkpoint_write_s)},
      {"allreduce_exposed_s", json_number(r.allreduce_exposed_s)},
      // Where wall time went on rank 0: waiting for the loader thread, and the CPU time of
      // the training thread (wall minus this is waiting, or time the VM's CPU was taken).
      {"loader_wait_s", json_number(r.loader_wait_s)},
      {"train_thread_cpu_s", json_number(r.cpu_s)},
      {"ranks", fmt::format("{}", p.ranks)},
      {"pipeline_stages", fmt::format("{}", p.P)},
      {"tensor_parallel", fmt::format("{}", p.T)},
      {"data_parallel", fmt::format("{}", p.D)},
      {"microbatches", fmt::format("{}", p.M)},
      {"schedule", json_string(p.pipelined() ? cfg.parallel.schedule : "none")},
      {"zero", fmt::format("{}", cfg.parallel.zero)},
      {"optimizer_state_bytes", json_list(memory.optimizer_state, 0)},
      {"gradient_bytes", json_list(memory.gradients, 0)},
      {"gradient_sum_bytes", json_list(memory.gradient_sum, 0)},
      {"peak_rss_mb", json_list(memory.peak_rss_mb, 1)},
      {"steady_device_allocs", json_list(memory.steady_device_allocs, 0)},
      {"steady_device_frees", json_list(memory.steady_device_frees, 0)}};
  for (auto& f : goodput_fields(r.goodput)) done.push_back(std::move(f));
  if (p.pipelined()) {
    done.push_back({"peak_live_microbatches", json_list(figures.peak_live, 0)});
    done.push_back({"peak_activation_mb", json_list(figures.peak_mb, 3)});
    done.push_back({"microbatch_activation_mb", json_list(figures.micro_mb, 6)});
    done.push_back({"stage_idle_share", json_list(figures.idle, 4)});
    done.push_back({"bubble_theory", json_number(figures.theory)});
    done.push_back({"stage_bubble_theory", json_list(figures.theory_idle, 4)});
    done.push_back({"live_microbatches_bound", json_list(figures.bound_live, 0)});
    fmt::print("pipeline: peak live micro-batches per stage {} (schedule {} allows {}), activations "
               "at peak {} MB; idle share per stage {} (the schedule's theory {}, mean {:.3f})\n",
               json_list(figures.peak_live, 0), cfg.parallel.schedule,
               json_list(figures.bound_live, 0), json_list(figures.peak_mb, 2),
               json_list(figures.idle, 3), json_list(figures.theory_idle, 3), figures.theory);
  }
  if (info.has_test) {
    done.push_back({"test_accuracy", json_number(ev.accuracy)});
    done.push_back({"test_loss", json_number(ev.loss)});
    if (info.tokens) done.push_back({"unigram_entropy_nats", json_number(info.unigram_entropy_nats)});
  }
  if (metrics) metrics->write(done);
  fmt::print("done: {} steps in {}, {:.0f} samples/s", steps_run, format_duration(train_s), sps);
  if (info.has_test && info.tokens)
    fmt::print(", validation loss {:.4f} nats per token (next-token accuracy {:.4f}; the "
               "unigram entropy of the training text is {:.4f})", ev.loss, ev.accuracy,
               info.unigram_entropy_nats);
  else if (info.has_test)
    fmt::print(", test accuracy {:.4f}, test loss {:.4f}", ev.accuracy, ev.loss);
  fmt::print("\n{}\nparameters written to {}\n", describe_goodput(r.goodput), cfg.params_path());
}

}  // namespace strata
