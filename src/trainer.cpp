#include "strata/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <climits>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "strata/checkpoint.h"
#include "strata/checkpointer.h"
#include "strata/job.h"
#include "strata/data_parallel.h"
#include "strata/error.h"
#include "strata/files.h"
#include "strata/goodput.h"
#include "strata/grid.h"
#include "strata/metrics.h"
#include "strata/optim.h"
#include "strata/pipeline.h"
#include "strata/prometheus.h"
#include "strata/trace.h"
#include "strata/watchdog.h"
#include "strata/whole_model.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
bool all_finite(const float* p, int64_t n) {
  float acc = 0;  // NaN and Inf survive a product with zero; finite values give zero
  for (int64_t i = 0; i < n; ++i) acc += p[i] * 0.0f;
  return acc == 0.0f;
}
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Creates the directory a file will be written into; an error names the file.
void ensure_parent_dir(const std::string& file) {
  std::string dir = std::filesystem::path(file).parent_path().string();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec) fail_input("{}: cannot create directory {} ({})", file, dir, ec.message());
    drop_world_write(dir);
  }
  if (::access(dir.c_str(), W_OK) != 0) fail_input("{}: directory {} is not writable", file, dir);
}

// The signal `count` ranks got, from the sum of their signal numbers: its name if they all
// got the same one, else "signals".
std::string signal_names(double sum, double count) {
  const int sig = int(std::lround(sum / count));
  return double(sig) * count == sum ? signal_name(sig) : "signals";
}

}  // namespace

void collectively(Comm& comm, const std::function<void()>& fn) {
  int64_t code = 0;
  std::string msg;
  try {
    fn();
  } catch (const UserError& e) {
    code = e.code;
    msg = e.what();
  }
  int64_t v[2] = {code ? comm.rank() : INT_MAX, code ? -code : 0};  // lowest failing rank, code
  comm.allreduce_min(v, 2);
  if (v[0] == INT_MAX) return;
  if (comm.rank() == v[0]) throw UserError(int(code), msg);
  throw AgreedFailure(int(-v[1]), "");
}

namespace {
// A batch where the backend computes: the loader's own buffers on the CPU, else copies
// uploaded into buffers kept from step to step.
class BatchOnBackend {
 public:
  struct View {
    const Tensor& x;
    const int32_t* y;
  };
  View put(const Backend& be, const Loader::Batch& b) {
    if (be.host_memory()) return {b.x, b.y.data()};
    x_.resize(b.x.shape, *be.memory);
    be.upload(x_.data(), b.x.data(), sizeof(float) * size_t(b.x.size()));
    y_.resize({int64_t(b.y.size())}, *be.memory);
    be.upload(y_.i32(), b.y.data(), sizeof(int32_t) * b.y.size());
    return {x_, y_.i32()};
  }

 private:
  Tensor x_, y_;  // y_ holds int32 labels
};

// One pass over a split, this replica's share of each batch: `batch_sums` gives a batch's
// {sum of per-row losses, correct predictions} (0 on ranks that do not hold the logits);
// the sums are added over `comm`. A sample has `rows` rows of logits (a language model's T
// positions; 1 for a classifier): loss and accuracy are per row.
EvalResult evaluate_split(
    const DatasetInfo& info, const std::string& split, int64_t batch, int replica, int replicas,
    Comm& comm, int64_t rows,
    const std::function<std::pair<double, int64_t>(const Loader::Batch&, int64_t)>& batch_sums) {
  // `batch` counts rows of logits: a language model's T rows per sample make its batches
  // T times fewer samples (its activations per sample are T times larger).
  batch = std::max<int64_t>(1, batch / rows);
  Loader loader(info, split, std::max<int64_t>(batch, replicas), replica, replicas,
                /*shuffle=*/false, 0);
  double sums[2] = {0, 0};  // loss, correct
  for (int64_t i = 0, n = loader.batches_per_epoch(); i < n; ++i) {
    const auto& b = loader.next();
    const int64_t bs = b.x.dim(0);  // samples; the same on every stage of a replica
    if (bs == 0) continue;
    auto [loss, correct] = batch_sums(b, bs);
    sums[0] += loss;
    sums[1] += double(correct);
  }
  comm.allreduce_sum(sums, 2);
  const SplitInfo& si = split == "test" ? info.test : info.train;
  const double n = double(si.n) * double(rows);
  return {.accuracy = sums[1] / n, .loss = sums[0] / n, .samples = si.n};
}
}  // namespace

namespace {
// The model's forward over this replica's share of a split, the sums over `comm`. A tensor
// group's parts all run every batch (the blocks exchange partial sums); only a part that
// `counts` adds its losses.
EvalResult evaluate_replica(Model& model, const Backend& be, const DatasetInfo& info,
                            const std::string& split, Comm& comm, int replica, int replicas,
                            bool counts, int64_t batch) {
  Tensor probs;
  BatchOnBackend on_be;
  const int64_t rps = model.rows_per_sample();
  return evaluate_split(info, split, batch, replica, replicas, comm, rps,
                        [&](const Loader::Batch& hb, int64_t bs) {
    const auto b = on_be.put(be, hb);
    const Tensor& logits = model.forward(be, b.x, StepInfo{.training = false});
    if (!counts) return std::pair<double, int64_t>{0, 0};
    probs.resize(logits.shape, *be.memory);
    const int c = model.classes(), rows = int(bs * rps);
    return std::pair{be.softmax_xent_forward(probs.data(), logits.data(), b.y, rows, c),
                     be.count_correct(logits.data(), b.y, rows, c)};
  });
}
}  // namespace

EvalResult evaluate(Model& model, const Backend& be, const DatasetInfo& info,
                    const std::string& split, Comm& comm, int64_t batch) {
  return evaluate_replica(model, be, info, split, comm, comm.rank(), comm.size(), true, batch);
}

EvalResult evaluate_pipelined(PipelineStage& pipe, const Backend& be, const DatasetInfo& info,
                              const std::string& split, Comm& world, const ProcessGrid& grid,
                              int64_t rows_per_sample, int64_t batch) {
  BatchOnBackend on_be;
  return evaluate_split(info, split, batch, grid.replica, grid.replicas, world,
                        rows_per_sample,
                        [&](const Loader::Batch& hb, int64_t bs) {
    const auto b = on_be.put(be, hb);
    auto sums = pipe.forward_only(be, b.x, b.y, bs);
    // Every part of a tensor group holds the logits: part 0's count.
    return grid.tensor == 0 ? sums : std::pair<double, int64_t>{0, 0};
  });
}

int run_train(const RunConfig& cfg, Comm& comm) {
  const bool lead = comm.rank() == 0;
  const int ranks = comm.size();
  const int P = cfg.parallel.pipeline_stages, T = cfg.parallel.tensor;
  std::string device_note;
  const Backend* bep = nullptr;
  DatasetInfo info;
  int D = 1, M = 1;  // data-parallel replicas, micro-batches per step
  std::vector<LayerInfo> layers;
  std::vector<LayerRange> ranges;
  collectively(comm, [&] {
    validate(cfg);
    check_job_environment();
    bep = &select_backend({.device = cfg.device, .threads = cfg.threads,
                           .precision = cfg.train.precision}, &device_note);
    D = data_parallel_width(ranks, P, T, cfg.train.batch_size);
    if (T > 1 && !bep->host_memory())
      fail_input("parallel.tensor = {}: tensor parallelism runs on the CPU for now (use "
                 "--device cpu)", T);
    M = resolve_microbatches(cfg.parallel.microbatches, P, cfg.train.batch_size, D);
    info = open_dataset(cfg.data.path);
    if (info.tokens != (cfg.model.type == "gpt"))
      fail_input("{}: holds {}, which model.type = \"{}\" does not take ({})", cfg.data.path,
                 info.tokens ? "tokens" : "images", cfg.model.type,
                 info.tokens ? "a token file trains model.type = \"gpt\"" : "a GPT trains on tokens: strata prepare text");
    if (info.tokens) {
      if (cfg.model.vocab != 0 && cfg.model.vocab != info.vocab)
        fail_input("model.vocab = {}, but {} has a vocabulary of {}", cfg.model.vocab,
                   cfg.data.path, info.vocab);
      set_context(info, cfg.model.context);
    }
    if (cfg.train.batch_size > info.train.n)
      fail_input("train.batch_size = {} is larger than the {} training samples in {}",
                 cfg.train.batch_size, info.train.n, cfg.data.path);
    layers = Model::describe_layers(cfg.model_spec(info.classes), info.train.sample_shape, info.classes);
    // Whatever the partition, one rank holds the largest layer whole (its tensor part of it).
    int largest = 0;
    for (int i = 0; i < int(layers.size()); ++i)
      if (layers[size_t(i)].params > layers[size_t(largest)].params) largest = i;
    require_model_memory(layers, {largest, largest + 1}, cfg.train.optimizer == "adamw" ? 4 : 3, T,
                         cfg.train.batch_size / D, fmt::format("rank {}", comm.rank()));
    if (lead && !cfg.trace.empty()) ensure_parent_dir(cfg.trace);
  });
  // The partition: rank 0 measures when asked (every rank must use the same costs).
  std::vector<double> costs = estimated_costs(layers);
  if (P > 1 && cfg.parallel.stage_layers.empty() && cfg.parallel.balance == "measured") {
    if (lead)
      costs = measured_costs(cfg.model_spec(info.classes), info.train.sample_shape, info.classes,
                             *bep, cfg.train.batch_size / D / M, 5);
    comm.broadcast(costs.data(), int64_t(costs.size() * sizeof(double)), 0);
  }
  collectively(comm, [&] { ranges = partition_layers(layers, costs, P, cfg.parallel.stage_layers); });
  // Rows of logits per sample: 1 for a classifier, T (a row per position) for a language model.
  const int64_t rps = numel(layers.back().out_shape) / info.classes;
  const Backend& be = *bep;
  const int64_t G = cfg.train.batch_size;
  // Micro-batches without a pipeline are plain gradient accumulation, run by the same engine.
  const bool pipelined = P > 1 || M > 1;
  // Checkpoints and the parameter file are written from the whole model gathered on rank 0
  // when ranks hold different parts of it.
  const bool gathered = pipelined || T > 1;
  ProcessGrid grid = make_grid(comm, P, T, cfg.parallel.placement, cfg.threads);
  // On a GPU: NCCL for the stage replicas' gradient allreduce, device buffers for the pipeline.
  grid.stage_comm = make_device_comm(std::move(grid.stage_comm), be);
  grid.pipe_comm = make_device_comm(std::move(grid.pipe_comm), be);

  std::unique_ptr<Model> model;
  collectively(comm, [&] {
    // Values and gradients, the optimizer's state, and on rank 0 the whole model that
    // checkpoints gather into: refused now, naming the layer, if it cannot fit.
    const double states = cfg.train.optimizer == "adamw" ? 2 : 1;
    const LayerRange all{0, int(layers.size())};
    require_model_memory(layers, gathered && lead ? all : ranges[size_t(grid.stage)],
                         2 + states, gathered && lead ? 1 : T,
                         cfg.train.batch_size / D / M, fmt::format("rank {}", comm.rank()));
    model = std::make_unique<Model>(cfg.model_spec(info.classes), info.train.sample_shape,
                                    info.classes, ranges[size_t(grid.stage)],
                                    TensorSplit{grid.tensor, T, grid.tensor_comm.get()});
    model->check_backend(be);
    if (lead) {
      ensure_parent_dir(cfg.params_path());
      ensure_parent_dir(cfg.metrics_path());
    }
  });
  model->init(cfg.train.seed);
  // With a pipeline or tensor parallelism, rank 0 also holds the whole model: checkpoints
  // gather into it.
  auto make_whole = [&] {
    return std::make_unique<Model>(cfg.model_spec(info.classes), info.train.sample_shape, info.classes);
  };

  std::unique_ptr<MetricsWriter> metrics;
  PrometheusFile prom;  // issue 17: operations metrics (rank 0)
  collectively(comm, [&] {
    if (lead) {
      metrics = std::make_unique<MetricsWriter>(cfg.metrics_path());
      drop_world_write(cfg.metrics_path());
      if (!cfg.output.prometheus.empty())
        prom = PrometheusFile(cfg.output.prometheus, slurm_job_id(), run_name_of(cfg.output.dir));
    }
  });

  // Every stage of a replica reads the replica's share (the first stage uses the samples,
  // the last the labels), so all stay at the same position in the data order.
  auto loader = std::make_unique<Loader>(info, "train", G, grid.replica, D, true, cfg.train.seed);
  const int64_t per_epoch = loader->batches_per_epoch();
  int64_t total = per_epoch * cfg.train.epochs;
  if (cfg.train.max_steps > 0) total = std::min(total, cfg.train.max_steps);

  OptimConfig oc{.kind = cfg.train.optimizer, .lr = cfg.train.lr, .momentum = cfg.train.momentum,
                 .weight_decay = cfg.train.weight_decay, .nesterov = cfg.train.nesterov,
                 .beta1 = cfg.train.beta1, .beta2 = cfg.train.beta2, .eps = cfg.train.eps,
                 .schedule = cfg.train.lr_schedule, .warmup_steps = cfg.train.warmup_steps,
                 .min_lr = cfg.train.min_lr, .total_steps = total, .grad_clip = cfg.train.grad_clip};
  Optimizer opt(oc, model->num_params());
  int64_t whole_params = 0;
  for (const auto& l : layers) whole_params += l.params;

  // Checkpoints: the directory is checked before any training, so a bad one fails now rather
  // than hours later; then the run continues from the newest checkpoint that verifies.
  Checkpointer ckpt(cfg, comm);
  const int64_t ckpt_bytes = whole_params * 4 * int64_t(1 + opt.state().size()) + (1 << 16);
  ckpt.preflight(ckpt_bytes);
  int64_t start_step = 0;
  std::unique_ptr<Model> whole;       // gathered: rank 0's assembly of every stage and part
  std::unique_ptr<Optimizer> whole_opt;
  std::optional<TrainState> resumed;
  if (!gathered) {
    resumed = ckpt.resume(*model, opt, cfg, info.source_sha256);
  } else if (lead || cfg.resume != "never") {
    // Checkpoints hold the whole model by global names, whatever grid wrote them: every rank
    // loads the whole (for a moment) and keeps its stage's block. Rank 0 keeps the whole to
    // gather checkpoints into. (Without a resume, ckpt.resume returns at once on every rank.)
    whole = make_whole();
    whole_opt = std::make_unique<Optimizer>(oc, whole->num_params());
    resumed = ckpt.resume(*whole, *whole_opt, cfg, info.source_sha256);
    if (resumed) take_stage(*whole, *whole_opt, *model, opt);
    if (!lead) {
      whole.reset();
      whole_opt.reset();
    }
  }
  // Parameters and optimizer state go where the backend computes (after init or resume).
  model->place(be);
  opt.place(be);
  if (auto& st = resumed) {
    start_step = std::min(st->step, total);
    if (start_step < total) loader->seek(st->epoch, st->batch);
    if (metrics)
      metrics->write({{"event", json_string("resumed")}, {"step", fmt::format("{}", st->step)},
                      {"slurm_restart_count", fmt::format("{}", slurm_restart_count())}});
  }
  // Names a rank that stops making progress and aborts the job (watchdog.timeout_s; 0 = off).
  // Collective; after the resume (reading a checkpoint may take long).
  // issue 17: the job's goodput ledger beside the checkpoints (rank 0); the watchdog's report
  // of a hung rank there too (slurm/train.sbatch excludes its node).
  GoodputLedger goodput(lead ? ckpt.dir() + "/goodput.toml" : "", slurm_job_id(), slurm_restart_count());
  Watchdog watchdog(comm, cfg.watchdog.timeout_s, ckpt.dir() + "/hung-rank");
  Provenance prov{.config_toml = cfg.to_toml(), .dataset_path = cfg.data.path,
                  .dataset_sha256 = info.source_sha256, .grid_ranks = ranks,
                  .grid_data_parallel = D, .grid_stages = P, .grid_tensor = T,
                  .slurm_job_id = slurm_job_id(),
                  .slurm_restart_count = slurm_restart_count(), .hosts = grid.hosts, .created_utc = ""};
  // Rank 0 watches the clock: the job's end time (Slurm) and the time-based checkpoint period.
  std::optional<double> end_time;
  if (lead) {
    std::string why_not;
    end_time = job_end_time(&why_not);
    if (!why_not.empty())
      fmt::print(stderr, "strata: warning: the job's time limit is unknown ({}); relying on "
                 "the scheduler's signals\n", why_not);
  }
  double ckpt_write_s = double(ckpt_bytes) / 50e6;  // until measured: a slow disk's 50 MB/s
  double step_s = 0, ckpt_total_s = 0;
  // Time kept free before the job's end: the checkpoint write (twice, for a slower disk at
  // that moment), a few steps (the stop is agreed one step ahead), and 10 s for the exit.
  auto stop_margin = [&] { return 10 + 2 * ckpt_write_s + 3 * step_s; };
  auto last_ckpt_time = Clock::now();
  int64_t last_ckpt_step = start_step;
  int64_t ckpt_failed = 0;  // rank 0: checkpoint writes that failed
  // Reports a finished write (metrics line, warning on failure); rank 0.
  auto report_checkpoint = [&](const Checkpointer::SaveResult& r) {
    if (r.ok) {
      ckpt_write_s = r.seconds + r.copy_s;  // a stop checkpoint must reach checkpoint.dir
      prom.note_checkpoint(r.step, r.seconds, r.stall_s, r.bytes);
      ckpt_total_s += r.seconds;
      if (metrics)
        metrics->write({{"event", json_string("checkpoint")}, {"step", fmt::format("{}", r.step)},
                        {"path", json_string(r.path)}, {"bytes", fmt::format("{}", r.bytes)},
                        {"write_s", json_number(r.seconds)}, {"stall_s", json_number(r.stall_s)},
                        {"mb_per_s", json_number(double(r.bytes) / 1e6 / std::max(r.seconds, 1e-9))}});
    }
    // A failed write leaves the earlier checkpoints intact and training goes on; the run
    // ends with kExitCheckpointsFailed rather than plain success.
    if (!r.ok) ++ckpt_failed;
    if (lead && !r.error.empty())
      fmt::print(stderr, "strata: warning: checkpoint at step {}: {}\n", r.step, r.error);
  };
  // Nothing non-finite is published: the update after the last checked loss can still make
  // parameters or optimizer state NaN/Inf (a rate that is too large), so the host copies are
  // checked, on every rank, before anything is written. Collective; exit 3 when they are not.
  ProgressLine progress(lead ? cfg.progress : "off");
  auto require_finite_state = [&](int64_t steps_done) {
    bool finite = all_finite(model->host_values().data(), model->host_values().size());
    for (auto& [name, t] : opt.state()) finite = finite && all_finite(t->data(), t->size());
    int64_t first_bad = finite ? INT_MAX : comm.rank();
    comm.allreduce_min(&first_bad, 1);
    if (first_bad == INT_MAX) return;
    progress.finish();
    if (metrics)
      metrics->write({{"event", json_string("diverged")}, {"step", fmt::format("{}", steps_done)},
                      {"loss", "null"}});
    if (comm.rank() != first_bad) throw AgreedFailure(kExitDiverged, "");
    throw UserError(kExitDiverged,
                    fmt::format("step {}: the update made parameters or optimizer state NaN/Inf "
                                "(training diverged; lower train.lr or set train.grad_clip); "
                                "nothing was written", steps_done));
  };
  // wait = false: periodic checkpoints, written in the background when checkpoint.async.
  auto save_checkpoint = [&](int64_t steps_done, bool wait) {
    const auto t_save = Clock::now();
    Watchdog::Exempt exempt(watchdog, "writing a checkpoint");
    prov.created_utc = utc_now_iso();
    TrainState st{.step = steps_done, .epoch = steps_done / per_epoch,
                  .batch = steps_done % per_epoch, .global_batch = G, .seed = cfg.train.seed,
                  .optimizer = cfg.train.optimizer, .optimizer_steps = opt.steps_taken()};
    const bool durable = wait;  // stop and final checkpoints: in checkpoint.dir on return
    wait = wait || !cfg.checkpoint.async;
    if (lead)
      if (auto prev = ckpt.finish()) report_checkpoint(*prev);
    model->pull(be);  // checkpoints are written from the host copies
    opt.pull(be);
    require_finite_state(steps_done);
    if (gathered) gather_stages(comm, grid, layers, ranges, *model, opt, whole.get(), whole_opt.get());
    auto r = gathered && lead ? ckpt.save(*whole, *whole_opt, st, prov, wait, durable)
                               : ckpt.save(*model, opt, st, prov, wait, durable);
    last_ckpt_time = Clock::now();
    last_ckpt_step = steps_done;
    if (wait) report_checkpoint(r);
    goodput.checkpoint(steps_done, since(t_save));
    return r.ok;
  };
  // Data parallelism within a stage: gradients are averaged over the stage's replicas.
  GradientAllreducer reducer(*grid.stage_comm, *model, model->grads().data(),
                             cfg.dp.bucket_mb * 1048576.0, cfg.dp.overlap);
  Tracer tracer = cfg.trace.empty() ? Tracer() : Tracer(start_step + 1, cfg.trace_steps);
  std::unique_ptr<PipelineStage> pipe;
  if (pipelined) pipe = std::make_unique<PipelineStage>(*model, *grid.pipe_comm, P, M, cfg.parallel.schedule, tracer);

  if (lead && end_time)
    fmt::print("job ends at {}; strata stops with a checkpoint before then (margin measured from "
               "its checkpoint writes)\n", local_clock_time(*end_time));
  if (lead) {
    fmt::print("strata {} ({}): {} rank{}, device {}\n", STRATA_VERSION, STRATA_GIT_COMMIT, ranks,
               ranks == 1 ? "" : "s", device_note);
    fmt::print("data {}: {} train samples{}, {} classes, sample shape {}\n", cfg.data.path,
               info.train.n, info.has_test ? fmt::format(", {} test", info.test.n) : "",
               info.classes, shape_str(info.train.sample_shape));
    if (!gathered) fmt::print("model:\n{}\n", model->summary());
    else fmt::print("model:\n{}\n", whole->summary());
    if (T > 1)
      fmt::print("tensor parallel: {} ranks split each block ({} of {} heads and {} of {} MLP "
                 "units each) x {} pipeline stage{} x {} data-parallel replica{}\n", T,
                 cfg.model.heads / T, cfg.model.heads, 4 * cfg.model.dim / T, 4 * cfg.model.dim,
                 P, P == 1 ? "" : "s", D, D == 1 ? "" : "s");
    if (pipelined) {
      fmt::print("pipeline: {} stage{} x {} data-parallel replica{} ({}), {} micro-batches of {} "
                 "per step, schedule {}, partition {}\n{}\n", P, P == 1 ? "" : "s", D,
                 D == 1 ? "" : "s", cfg.parallel.placement, M, G / D / M, cfg.parallel.schedule,
                 !cfg.parallel.stage_layers.empty() ? "parallel.stage_layers" : cfg.parallel.balance,
                 partition_summary(layers, costs, ranges));
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
                   grid.node_ranks, cfg.threads, cfg.threads == 1 ? "" : "s", grid.node_cores,
                   comm.host());
    }
    const std::string span =
        total < per_epoch * cfg.train.epochs
            ? fmt::format("train.max_steps; an epoch is {} steps", per_epoch)
            : fmt::format("{} epoch{} of {} steps", cfg.train.epochs, cfg.train.epochs == 1 ? "" : "s", per_epoch);
    fmt::print("training {} steps ({}), global batch {} ({} per replica), {} allreduce bucket{}\n",
               total, span, G, G / D, reducer.num_buckets(), reducer.num_buckets() == 1 ? "" : "s");
    // What activation recomputation trades: the blocks' internal activations per micro-batch.
    int blocks = 0, recomputed = 0;
    int64_t block_bytes = 0, recomputed_bytes = 0;
    for (const auto& l : layers) {
      if (l.internal_bytes == 0) continue;
      ++blocks;
      block_bytes += l.internal_bytes;
      if (l.recomputes) ++recomputed, recomputed_bytes += l.internal_bytes;
    }
    const double mib = double(G / D / M) / 1048576.0 / T;  // per micro-batch and tensor part
    if (recomputed > 0)
      fmt::print("recompute: {} of {} blocks recompute their activations in backward: {:.1f} of "
                 "{:.1f} MiB per micro-batch not kept (per rank: split over the stages{}), one "
                 "block's set alive at a time instead\n", recomputed, blocks,
                 double(recomputed_bytes) * mib, double(block_bytes) * mib,
                 T > 1 ? " and, roughly, the tensor parts" : "");
    std::fflush(stdout);
  }

  // The global gradient norm (clipping) sums the squares of every rank of a replica's model,
  // each parameter counted once.
  Comm* norm_comm = P > 1 || T > 1 ? grid.model_comm.get() : nullptr;
  const auto norm_ranges = model->norm_ranges();
  // GPT-2's token table on a pipeline's first and last stage: the embedding's gradient and the
  // output layer's, summed (after the replicas' average), so both copies take one update.
  auto share_tied_gradient = [&] {
    if (Param* t = model->tied_table(); t && grid.tied_comm) {
      Tracer::Scope span(tracer, "allreduce", "token table gradient (first + last stage)");
      grid.tied_comm->allreduce_sum(t->grad, numel(t->shape));
    }
  };
  BatchOnBackend on_be;
  const bool update_in_backward = ranks == 1 && !pipelined && opt.can_update_in_backward();
  Tensor probs, dlogits;
  const auto t_start = Clock::now();
  auto t_log = t_start;
  int64_t samples_since_log = 0;
  double exposed_total = 0, loader_wait = 0;
  const double cpu_start = thread_cpu_seconds();
  // Pipeline: the share of each step's wall time this rank waits for others (receives, sends,
  // the agreement), every step after the first: the measured bubble is its median (robust to
  // a step during which the machine took the CPU away).
  std::vector<double> idle_shares;
  comm.barrier();  // so that every rank's trace starts at the same moment
  goodput.begin(start_step);
  tracer.set_origin();
  for (int64_t step = start_step; step < total; ++step) {
    watchdog.step_begin(step);
    tracer.begin_step(step);
    const auto t_step = Clock::now();
    const auto t_wait = Clock::now();
    const Loader::Batch* batchp;
    {
      Tracer::Scope span(tracer, "data", "next batch");
      batchp = &loader->next();
    }
    loader_wait += since(t_wait);
    const auto batch = on_be.put(be, *batchp);
    const int b = int(batchp->x.dim(0));  // samples (a language model has T labels each)
    StepInfo si{.training = true, .seed = cfg.train.seed, .step = uint64_t(step),
                .first_sample = batchp->first_sample};
    double loss = 0, pipe_wait0 = 0;
    if (pipelined) {
      // Every micro-batch's forward and backward, in schedule order; the data-parallel
      // allreduce starts during the last backward. Agreement comes after it (the loss exists
      // only on the last stage, once all micro-batches are through), still before the update.
      pipe_wait0 = pipe->stats().wait_s;
      loss = pipe->run(be, batch.x, batch.y, b, si, G,
                       [&](int64_t ready) { reducer.on_grads_ready(ready); });
      Tracer::Scope span(tracer, "allreduce", "gradient allreduce (stage replicas)");
      reducer.finish();
    } else {
      Tracer::Scope span(tracer, "compute", "forward");
      const Tensor& logits = model->forward(be, batch.x, si);
      probs.resize(logits.shape, *be.memory);
      dlogits.resize(logits.shape, *be.memory);
      const int rows = int(b * rps);  // a row of logits per sample, or per position (LM)
      loss = be.softmax_xent_forward(probs.data(), logits.data(), batch.y, rows, info.classes);
      be.softmax_xent_backward(dlogits.data(), probs.data(), batch.y, rows, info.classes,
                               1.0f / float(G * rps));
    }
    // One allreduce agrees on the loss (before the update, so a diverged step changes no
    // parameter) and on whether to checkpoint and/or stop after this step: any rank that got a
    // stop signal (and which: the sum of the signal numbers over the count names it when all
    // got the same, as srun's forwarding does, whichever rank got it first), rank 0 for the
    // time limit and the checkpoint period.
    // (A tensor group's ranks all hold the loss: part 0's counts.)
    double agree[5] = {grid.tensor == 0 ? loss : 0.0, stop_signal() ? 1.0 : 0.0, 0.0, 0.0,
                       double(stop_signal())};
    if (lead) {
      agree[2] = end_time && unix_now() + stop_margin() >= *end_time ? 1.0 : 0.0;
      agree[3] = cfg.checkpoint.every_seconds > 0 &&
                 since(last_ckpt_time) >= cfg.checkpoint.every_seconds ? 1.0 : 0.0;
    }
    const auto t_agree = Clock::now();
    comm.allreduce_sum(agree, 5);
    tracer.span("allreduce", "agree: loss, stop, checkpoint", t_agree, Clock::now());
    if (pipelined && step > start_step) {
      idle_shares.push_back((pipe->stats().wait_s - pipe_wait0 + since(t_agree)) /
                            std::max(since(t_step), 1e-12));
    }
    loss = agree[0] / double(G * rps);
    const bool stop_now = agree[1] > 0 || agree[2] > 0;
    if (!std::isfinite(loss)) {
      progress.finish();
      if (lead) {
        if (metrics)
          metrics->write({{"event", json_string("diverged")}, {"step", fmt::format("{}", step)},
                          {"loss", json_number(loss)}});
        fmt::print(stderr, "strata: error: step {}: loss is {} (training diverged; lower "
                   "train.lr or set train.grad_clip); no parameters were written\n", step,
                   std::isnan(loss) ? "NaN" : "Inf");
      }
      return kExitDiverged;
    }
    if (pipelined) {
      share_tied_gradient();
      Tracer::Scope span(tracer, "optimizer", "optimizer step");
      opt.step(be, model->values(), model->grads(), step, norm_comm, &norm_ranges);
    } else if (update_in_backward) {
      Tracer::Scope span(tracer, "compute", "backward + optimizer");
      // One rank, no clipping: update each layer's parameters as soon as backward has
      // produced their gradients, while those are still in cache (the layer's own backward
      // is done with its weights; earlier layers do not read them). Same arithmetic as one
      // update at the end.
      int64_t updated = 0;
      model->backward(be, dlogits, [&](int64_t ready) {
        opt.apply(be, model->values(), model->grads(), updated, ready, step);
        updated = ready;
      });
      opt.end_step();
    } else {
      {
        Tracer::Scope span(tracer, "compute", "backward");
        model->backward(be, dlogits, [&](int64_t ready) { reducer.on_grads_ready(ready); });
      }
      {
        Tracer::Scope span(tracer, "allreduce", "gradient allreduce");
        reducer.finish();
      }
      Tracer::Scope span(tracer, "optimizer", "optimizer step");
      opt.step(be, model->values(), model->grads(), step, norm_comm, &norm_ranges);
    }
    samples_since_log += G;
    const int64_t done_steps = step + 1;
    step_s = step_s == 0 ? since(t_step) : 0.8 * step_s + 0.2 * since(t_step);
    goodput.step_done(done_steps, since(t_step));

    if (stop_now) {
      progress.finish();
      const std::string why =
          agree[1] > 0 ? fmt::format("a stop signal ({} on {} of {} ranks)", signal_names(agree[4], agree[1]),
                                     agree[1], ranks)
                       : fmt::format("the job's time limit (ends {}, margin {:.0f} s)",
                                     end_time ? local_clock_time(*end_time) : "?", stop_margin());
      const bool ok = save_checkpoint(done_steps, /*wait=*/true);
      if (lead) {
        if (metrics)
          metrics->write({{"event", json_string("stopped")}, {"step", fmt::format("{}", done_steps)},
                          {"checkpoint_written", ok ? "true" : "false"}});
        if (ok)
          fmt::print("stopped after step {} for {}: checkpoint written; exit {} (resumable)\n",
                     done_steps, why, int(kExitResumable));
      }
      if (!ok) {
        if (lead)
          fmt::print(stderr, "strata: error: stopped after step {} for {} but the checkpoint "
                     "could not be written; the previous one is intact\n", done_steps, why);
        return kExitInternal;
      }
      return kExitResumable;
    }
    if (done_steps < total &&
        ((cfg.checkpoint.every_steps > 0 && done_steps % cfg.checkpoint.every_steps == 0) ||
         agree[3] > 0))
      save_checkpoint(done_steps, /*wait=*/false);
    if (lead)
      if (auto r = ckpt.poll()) report_checkpoint(*r);

    const bool last = step + 1 == total;
    if ((step + 1) % cfg.train.log_every == 0 || last) {
      const double dt = since(t_log), elapsed = since(t_start);
      const double sps = samples_since_log / std::max(dt, 1e-9);
      const double eta = elapsed / double(step + 1) * double(total - step - 1);
      const int64_t epoch = step / per_epoch;
      exposed_total += reducer.stats().exposed_s;
      if (metrics)
        metrics->write({{"step", fmt::format("{}", step + 1)},
                        {"epoch", json_number(double(step + 1) / double(per_epoch))},
                        {"loss", json_number(loss)},
                        {"lr", json_number(lr_at(oc, step))},
                        {"samples_per_s", json_number(sps)},
                        {"time_s", json_number(elapsed)}});
      progress.update(fmt::format("epoch {}/{}  step {}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}",
                                  epoch + 1, cfg.train.epochs, step + 1, total, loss, sps,
                                  format_duration(eta)),
                      /*force_newline=*/last || !progress.in_place());
      if (prom.active()) {
        const double n = double(samples_since_log) / double(G);  // steps in the interval
        prom.write({.step = step + 1, .loss = loss, .samples_per_s = sps,
                    .tokens_per_s = info.tokens ? sps * double(rps) : 0.0, .step_s = dt / n,
                    .allreduce_exposed_s = reducer.stats().exposed_s / n,
                    .progress_age_s = watchdog.active() ? watchdog.progress_age_s() : -1.0,
                    .slurm_restart_count = slurm_restart_count(), .goodput = goodput.figures()});
      }
      reducer.reset_stats();
      t_log = Clock::now();
      samples_since_log = 0;
    }
  }
  if (ckpt.periodic() && cfg.checkpoint.final && last_ckpt_step < total)
    save_checkpoint(total, /*wait=*/true);
  if (lead) {
    Watchdog::Exempt exempt(watchdog, "finishing a checkpoint write");
    if (auto r = ckpt.finish()) report_checkpoint(*r);
  }
  watchdog.stop();  // collective; the final evaluation and parameter file are not watched
  const double train_s = since(t_start);
  const int64_t steps_run = total - start_step;
  const double train_cpu_s = thread_cpu_seconds() - cpu_start;
  progress.finish();
  loader.reset();  // the loader thread owns HDF5 while alive

  PipelineFigures figures;
  if (pipelined) figures = pipeline_figures(comm, grid, pipe->stats(), idle_shares, M);
  tracer.write(comm, cfg.trace, fmt::format("rank {} · {} · {}", comm.rank(), grid.where(), comm.host()));

  // The final parameters: finite, or nothing is evaluated or written.
  model->pull(be);
  opt.pull(be);
  require_finite_state(total);
  // With a pipeline the test set goes through the stages, and the parameter file is written
  // from the whole model gathered on rank 0 (as for a checkpoint).
  EvalResult ev;
  if (info.has_test)
    ev = pipelined ? evaluate_pipelined(*pipe, be, info, "test", comm, grid, rps)
                   : evaluate_replica(*model, be, info, "test", comm, grid.replica,
                                      grid.replicas, grid.tensor == 0, 1000);
  // Finite parameters can still be a diverged model (logits that overflow): its test loss
  // says so, and then nothing is written.
  if (info.has_test && !std::isfinite(ev.loss)) {
    if (metrics)
      metrics->write({{"event", json_string("diverged")}, {"step", fmt::format("{}", total)},
                      {"test_loss", "null"}});
    if (!lead) throw AgreedFailure(kExitDiverged, "");
    throw UserError(kExitDiverged,
                    fmt::format("step {}: the test loss is {} (training diverged; lower train.lr "
                                "or set train.grad_clip); {} was not written", total,
                                std::isnan(ev.loss) ? "NaN" : "Inf", cfg.params_path()));
  }
  Model* final_model = model.get();
  if (gathered) {
    gather_stages(comm, grid, layers, ranges, *model, opt, whole.get(), whole_opt.get());
    final_model = whole.get();
  }
  if (lead) {
    save_parameters(cfg.params_path(), *final_model,
                    {.config_toml = cfg.to_toml(), .dataset_sha256 = info.source_sha256, .step = total});
    std::vector<MetricsWriter::Field> done = {
        {"event", json_string("done")}, {"step", fmt::format("{}", total)},
        {"train_time_s", json_number(train_s)},
        {"samples_per_s", json_number(double(steps_run) * G / std::max(train_s, 1e-9))},
        {"checkpoint_write_s", json_number(ckpt_total_s)},
        {"allreduce_exposed_s", json_number(exposed_total)},
        // Where wall time went on rank 0: waiting for the loader thread, and the CPU time of
        // the training thread (wall minus this is waiting, or time the VM's CPU was taken).
        {"loader_wait_s", json_number(loader_wait)},
        {"train_thread_cpu_s", json_number(train_cpu_s)},
        {"ranks", fmt::format("{}", ranks)},
        {"pipeline_stages", fmt::format("{}", P)},
        {"tensor_parallel", fmt::format("{}", T)},
        {"data_parallel", fmt::format("{}", D)},
        {"microbatches", fmt::format("{}", M)},
        {"schedule", json_string(pipelined ? cfg.parallel.schedule : "none")}};
    const GoodputFigures gp = goodput.figures();  // issue 17: the job's goodput so far
    goodput.finish(/*done=*/true);
    for (auto& f : goodput_fields(gp)) done.push_back(std::move(f));
    if (pipelined) {
      done.push_back({"peak_live_microbatches", json_list(figures.peak_live, 0)});
      done.push_back({"peak_activation_mb", json_list(figures.peak_mb, 3)});
      done.push_back({"stage_idle_share", json_list(figures.idle, 4)});
      done.push_back({"bubble_theory", json_number(figures.theory)});
      fmt::print("pipeline: peak live micro-batches per stage {} (schedule {}: {}), activations "
                 "at peak {} MB; idle share per stage {} (theory (P-1)/(M+P-1) = {:.3f})\n",
                 json_list(figures.peak_live, 0), cfg.parallel.schedule,
                 cfg.parallel.schedule == "gpipe" ? "M" : "at most P - stage",
                 json_list(figures.peak_mb, 2), json_list(figures.idle, 3), figures.theory);
    }
    if (info.has_test) {
      done.push_back({"test_accuracy", json_number(ev.accuracy)});
      done.push_back({"test_loss", json_number(ev.loss)});
      if (info.tokens) done.push_back({"unigram_entropy_nats", json_number(info.unigram_entropy_nats)});
    }
    if (metrics) metrics->write(done);
    fmt::print("done: {} steps in {}, {:.0f} samples/s", steps_run, format_duration(train_s),
               double(steps_run) * G / std::max(train_s, 1e-9));
    if (info.has_test && info.tokens)
      fmt::print(", validation loss {:.4f} nats per token (next-token accuracy {:.4f}; the "
                 "unigram entropy of the training text is {:.4f})", ev.loss, ev.accuracy,
                 info.unigram_entropy_nats);
    else if (info.has_test)
      fmt::print(", test accuracy {:.4f}, test loss {:.4f}", ev.accuracy, ev.loss);
    fmt::print("\n{}\nparameters written to {}\n", describe_goodput(gp), cfg.params_path());
  }
  comm.broadcast(&ckpt_failed, sizeof ckpt_failed, 0);
  if (ckpt_failed > 0) {
    if (lead)
      fmt::print(stderr, "strata: error: checkpoint.dir {}: {} checkpoint write{} failed during "
                 "the run (each reported above); {} was written, but the run was not "
                 "protected against faults\n", ckpt.dir(), ckpt_failed,
                 ckpt_failed == 1 ? "" : "s", cfg.params_path());
    return kExitCheckpointsFailed;
  }
  return kExitOk;
}

}  // namespace strata
