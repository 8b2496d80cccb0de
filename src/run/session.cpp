#include "run/session.h"

#include <time.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/files.h"
#include "base/job.h"
#include "base/memory.h"
#include "checkpoint/checkpoint.h"
#include "parallel/whole_model.h"
#include "parallel/zero.h"
#include "run/divergence.h"
#include "run/init_from.h"
#include "run/memory_estimate.h"
#include "run/session_report.h"
#include "strata/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

OptimConfig optim_config(const RunConfig& cfg, int64_t total_steps) {
  return {.kind = cfg.train.optimizer, .lr = cfg.train.lr, .momentum = cfg.train.momentum,
          .weight_decay = cfg.train.weight_decay, .nesterov = cfg.train.nesterov,
          .beta1 = cfg.train.beta1, .beta2 = cfg.train.beta2, .eps = cfg.train.eps,
          .schedule = cfg.train.lr_schedule, .warmup_steps = cfg.train.warmup_steps,
          .min_lr = cfg.train.min_lr, .total_steps = total_steps, .grad_clip = cfg.train.grad_clip};
}

// Rank 0, before any step: every file the run writes (some only at its end) can be written,
// and none is a file the run reads, so neither a late failure nor a success costs an input.
void check_outputs(const RunConfig& cfg) {
  const bool resume_file = cfg.resume != "never" && cfg.resume != "auto";
  const std::vector<NamedPath> inputs = {{"data.path", cfg.data.path},
                                         {"data.val_path", cfg.data.val_path},
                                         {"train.init_from", cfg.train.init_from},
                                         {"--resume", resume_file ? cfg.resume : ""}};
  for (const NamedPath& out : {NamedPath{"output.params", cfg.params_path()},
                               NamedPath{"output.metrics", cfg.metrics_path()},
                               NamedPath{"--trace", cfg.trace},
                               NamedPath{"output.prometheus", cfg.output.prometheus}}) {
    if (out.path.empty()) continue;
    refuse_writing_over(out, inputs);
    ensure_parent_dir(out.path, out.key);
  }
}

}  // namespace

int run_train(const RunConfig& cfg, Comm& comm) {
  TrainingSession session(cfg, comm);
  return session.run();
}

TrainingSession::TrainingSession(const RunConfig& cfg, Comm& comm)
    : cfg_(cfg), comm_(comm), lead_(comm.rank() == 0), plan_(plan_run(cfg, comm)),
      be_(*plan_.be), grid_(make_grid(comm, plan_.P, plan_.T, cfg.parallel.placement, cfg.threads)) {
  // On a GPU every communicator that sums or moves the model's tensors carries device memory:
  // NCCL for the stage replicas' gradients, device buffers for the pipeline and the tied token
  // table's gradient (first + last stage). (Tensor parts run on the CPU only: run_plan.)
  grid_.stage_comm = make_device_comm(std::move(grid_.stage_comm), be_);
  grid_.pipe_comm = make_device_comm(std::move(grid_.pipe_comm), be_);
  if (grid_.tied_comm) grid_.tied_comm = make_device_comm(std::move(grid_.tied_comm), be_);
  build_model();
  // Every stage of a replica reads the replica's share (the first stage uses the samples, the
  // last the labels), so all stay at the same position in the data order.
  const int64_t G = cfg.train.batch_size;
  loader_ = std::make_unique<Loader>(plan_.info, "train", G, grid_.replica, plan_.D, true,
                                     cfg.train.seed);
  per_epoch_ = loader_->batches_per_epoch();
  total_ = per_epoch_ * cfg.train.epochs;
  if (cfg.train.max_steps > 0) total_ = std::min(total_, cfg.train.max_steps);
  oc_ = optim_config(cfg, total_);
  // ZeRO: this replica's shard of the stage's flat buffer (zero.h).
  const int zero = cfg.parallel.zero;
  if (zero) shards_ = zero_counts(*model_, plan_.D);
  opt_ = std::make_unique<Optimizer>(oc_, model_->num_params(),
                                     zero ? zero_shard(shards_, grid_.replica) : OptimShard{});
  resume();
  // The job's goodput ledger beside the checkpoints, kept by rank 0 across attempts.
  goodput_ = std::make_unique<GoodputLedger>(lead_ ? ckpt_->dir() + "/goodput.toml" : "",
                                             slurm_job_id(), slurm_restart_count());
  // Names a rank that stops making progress and aborts the job (watchdog.timeout_s; 0 = off;
  // a silent process after watchdog.heartbeat_timeout_s),
  // and writes checkpoint.dir/hung-rank for slurm/train.sbatch to leave its node out.
  // Collective; after the resume (reading a checkpoint may take long).
  watchdog_ = std::make_unique<Watchdog>(comm, cfg.watchdog.timeout_s, cfg.watchdog.heartbeat_timeout_s,
                                         ckpt_->dir() + "/hung-rank");
  Provenance prov{.config_toml = cfg.to_toml(), .dataset_path = cfg.data.path,
                  .dataset_sha256 = plan_.info.source_sha256, .grid_ranks = plan_.ranks,
                  .grid_data_parallel = plan_.D, .grid_stages = plan_.P, .grid_tensor = plan_.T,
                  .slurm_job_id = slurm_job_id(), .slurm_restart_count = slurm_restart_count(),
                  .hosts = grid_.hosts, .created_utc = "", .tokenizer = plan_.info.tokenizer};
  progress_ = std::make_unique<ProgressLine>(lead_ ? cfg.progress : "off");
  publisher_ = std::make_unique<Publisher>(
      cfg, comm, plan_, grid_, *ckpt_, PublishedState{*model_, *opt_, whole_.get(), whole_opt_.get()},
      CheckpointReports{metrics_.get(), prom_, *goodput_}, *progress_, *watchdog_, std::move(prov), per_epoch_, ckpt_bytes_, start_step_);
  // Data parallelism within a stage: gradients are averaged over the stage's replicas.
  reducer_ = std::make_unique<GradientAllreducer>(*grid_.stage_comm, *model_, model_->grads(),
                                                  cfg.dp.bucket_mb * 1048576.0, cfg.dp.overlap,
                                                  zero == 2 ? &shards_ : nullptr);
  tracer_ = std::make_unique<Tracer>(cfg.trace.empty() ? Tracer() : Tracer(start_step_ + 1, cfg.trace_steps));
  if (plan_.pipelined())
    pipe_ = std::make_unique<PipelineStage>(*model_, *grid_.pipe_comm, plan_.P, plan_.M,
                                            cfg.parallel.schedule, *tracer_);
  step_ = std::make_unique<TrainStep>(*model_, *opt_, *reducer_, pipe_.get(), grid_, *tracer_, G,
                                      plan_.ranks == 1, zero ? &shards_ : nullptr);
  hooks_.add(watchdog_hook(*watchdog_));
  hooks_.add(trace_hook(*tracer_));
  hooks_.add(goodput_hook(*goodput_));
  auto stop = std::make_unique<StopHook>(comm, *publisher_, metrics_.get(), *progress_);
  stop_ = stop.get();
  hooks_.add(std::move(stop));
  hooks_.add(checkpoint_hook(ckpt_->policy(), comm, *publisher_));
  if (mem_) {
    hooks_.add(memory_checkpoint_hook(*mem_, per_epoch_, be_, *goodput_));
    step_->set_update_hooks({.before_backward = [m = mem_.get()] { m->before_backward(); },
                             .before_update = [m = mem_.get()] { (void)m->fence(); },
                             .after_update = [m = mem_.get()] { m->after_update(); }});
    reducer_->set_gate(&gate_);
    mem_->set_gate(&gate_);
  }
  auto metrics = std::make_unique<MetricsHook>(cfg, oc_, per_epoch_, metrics_.get(), *progress_, *reducer_);
  metrics_hook_ = metrics.get();
  hooks_.add(std::move(metrics));
  hooks_.add(prometheus_hook(prom_, *metrics_hook_, *goodput_, *watchdog_,
                             plan_.info.tokens ? plan_.rows_per_sample : 0));
}

// This rank's stage of the model (its tensor part), initialised; the outputs rank 0 writes.
void TrainingSession::build_model() {
  AllocationScope scope("building the model (parameters, gradients, optimizer state)");
  const RunConfig& cfg = cfg_;
  if (lead_) {  // what this needs, before any of it is allocated
    fmt::print("{}\n", plan_line(cfg, plan_));
    std::fflush(stdout);
  }
  collectively(comm_, [&] {
    // Values and gradients, the optimizer's state, and on rank 0 the whole model that
    // checkpoints gather into: refused now, naming the layer, if it cannot fit.
    const double states = cfg.train.optimizer == "adamw" ? 2 : 1;
    const LayerRange all{0, int(plan_.layers.size())};
    const bool whole = plan_.gathered() && lead_;
    const auto chunks = stage_chunks(plan_.ranges, plan_.P, grid_.stage);
    require_chunks_memory(plan_.layers, whole ? std::vector<LayerRange>{all} : chunks,
                         2 + states, whole ? 1 : plan_.T, plan_.micro_batch(cfg.train.batch_size),
                         fmt::format("rank {}", comm_.rank()));
    model_ = std::make_unique<Model>(cfg.model_spec(plan_.info.classes),
                                     plan_.info.train.sample_shape, plan_.info.classes, chunks,
                                     TensorSplit{grid_.tensor, plan_.T, grid_.tensor_comm.get()});
    model_->check_backend(be_);
    if (lead_) check_outputs(cfg);
  });
  model_->init(cfg.train.seed);
  collectively(comm_, [&] {
    if (lead_) {
      metrics_ = std::make_unique<MetricsWriter>(cfg.metrics_path());
      drop_world_write(cfg.metrics_path());
      if (!cfg.output.prometheus.empty())
        prom_ = PrometheusFile(cfg.output.prometheus, slurm_job_id(), run_name_of(cfg.output.dir));
    }
  });
}

// Checkpoints: the directory is checked before any training, so a bad one fails now rather
// than hours later; then the run continues from the newest checkpoint that verifies.
// Parameters and optimizer state then go where the backend computes.
void TrainingSession::resume() {
  AllocationScope scope("reading the checkpoint to resume from");
  ckpt_ = std::make_unique<Checkpointer>(cfg_, comm_, plan_.writer.kind);
  int64_t whole_params = 0;
  for (const auto& l : plan_.layers) whole_params += l.params;
  ckpt_bytes_ = whole_params * 4 * int64_t(1 + opt_->state().size()) + (1 << 16);
  ckpt_->preflight(ckpt_bytes_);
  std::optional<TrainState> resumed;
  const std::string& sha = plan_.info.source_sha256;
  // ZeRO: the checkpoint's whole state first (for a moment), then this rank's shard of it.
  std::unique_ptr<Optimizer> unsharded;
  auto opt = [&]() -> Optimizer& {
    if (!opt_->sharded()) return *opt_;
    if (!unsharded) unsharded = std::make_unique<Optimizer>(oc_, model_->num_params());
    return *unsharded;
  };
  // Memory checkpoints first: the newest complete generation in the nodes' memory when it is
  // at least as new as the files (each rank restores its own part; rank 0 still assembles the
  // whole model for the file checkpoints when the plan gathers).
  // Data-parallel replicas without ZeRO hold the same parameters and optimizer state.
  const int64_t same_as = memory_part_key(grid_.stage, grid_.tensor, grid_.tensors, opt_->sharded());
  mem_ = MemoryState::make(cfg_, comm_, be_, fmt::format("grid {} {} {} {} zero {}", plan_.ranks, plan_.D,
                                                    plan_.P, plan_.T, cfg_.parallel.zero),
                           same_as, *model_, *opt_);
  if (mem_ && cfg_.resume == "auto") resumed = mem_->restore(ckpt_->newest_file_step());
  if (resumed) {
    resumed_from_ = "memory";
    if (plan_.gathered() && lead_) make_whole();
  } else if (!plan_.gathered()) {
    resumed = ckpt_->resume(*model_, opt, cfg_, sha);
  } else if (lead_ || cfg_.resume != "never") {
    // Checkpoints hold the whole model by global names, whatever grid wrote them: every rank
    // loads the whole (for a moment) and keeps its stage's block. Rank 0 keeps the whole to
    // gather checkpoints into. (Without a resume, resume() returns at once on every rank.)
    make_whole();
    resumed = ckpt_->resume(*whole_, [&]() -> Optimizer& { return *whole_opt_; }, cfg_, sha);
    if (resumed) take_stage(*whole_, *whole_opt_, *model_, opt());
    if (!lead_) {
      whole_.reset();
      whole_opt_.reset();
    }
  }
  if (resumed && unsharded) take_shard(*unsharded, *opt_);
  unsharded.reset();
  if (!resumed && !cfg_.train.init_from.empty())
    init_from_file(cfg_, plan_, comm_, *model_, whole_.get());
  model_->place(be_);
  opt_->place(be_);
  if (!resumed) return;
  if (resumed_from_.empty()) resumed_from_ = "file";
  start_step_ = std::min(resumed->step, total_);
  if (start_step_ < total_) loader_->seek(resumed->epoch, resumed->batch);
  if (metrics_)
    metrics_->write({{"event", json_string("resumed")}, {"step", fmt::format("{}", resumed->step)},
                     {"slurm_restart_count", fmt::format("{}", slurm_restart_count())}});
}

// The whole model (every layer, whole tensors) and its optimizer, which checkpoints of a
// pipeline or tensor-parallel grid are read into and gathered from.
void TrainingSession::make_whole() {
  whole_ = std::make_unique<Model>(cfg_.model_spec(plan_.info.classes),
                                   plan_.info.train.sample_shape, plan_.info.classes);
  whole_opt_ = std::make_unique<Optimizer>(oc_, whole_->num_params());
}

int TrainingSession::run() {
  if (lead_)
    print_startup({.cfg = cfg_, .plan = plan_, .grid = grid_, .host = comm_.host(),
                   .end_time = stop_->end_time(),
                   .model_summary = plan_.gathered() ? whole_->summary() : model_->summary(),
                   .per_epoch = per_epoch_, .total = total_, .buckets = reducer_->num_buckets(),
                   .model = *model_, .opt = *opt_,
                   .periodic_checkpoints = ckpt_->policy().periodic()});
  const auto t_start = Clock::now();
  const double cpu_start = thread_cpu_seconds();
  comm_.barrier();  // so that every rank's trace starts at the same moment
  goodput_->begin(start_step_, resumed_from_, mem_ ? mem_->restored_useful_s() : -1);
  tracer_->set_origin();
  for (int64_t step = start_step_; step < total_; ++step) {
    if (auto code = train_step(step)) {
      // A stop wrote its checkpoint to checkpoint.dir: the memory copies are not needed.
      if (mem_) mem_->finish(/*remove=*/*code == kExitResumable);
      return *code;
    }
    if (step == start_step_ + 1) allocs_at_step2_ = device_allocations();
  }
  allocs_at_end_ = total_ - start_step_ >= 2 ? device_allocations() : allocs_at_step2_;
  return finish_run(t_start, cpu_start);
}

std::optional<int> TrainingSession::train_step(int64_t step) {
  AllocationScope scope("a training step (activations and their gradients)");
  hooks_.begin(step);
  const auto t_step = Clock::now();
  const Loader::Batch* batch;
  {
    Tracer::Scope span(*tracer_, "data", "next batch");
    batch = &loader_->next();
  }
  loader_wait_s_ += since(t_step);
  const StepInfo si{.training = true, .seed = cfg_.train.seed, .step = uint64_t(step),
                    .first_sample = batch->first_sample};
  const double wait0 = step_->pipeline_wait_s();
  Agreement a;
  a.loss = step_->compute(be_, *batch, si);
  if (grid_.tensor != 0) a.loss = 0;  // every part of a tensor group holds the loss: part 0's counts
  hooks_.vote(a);
  const auto t_agree = Clock::now();
  a.sum_over(comm_);
  tracer_->span("allreduce", "agree: loss, stop, checkpoint", t_agree, Clock::now());
  if (pipe_ && step > start_step_)
    idle_shares_.push_back((step_->pipeline_wait_s() - wait0 + since(t_agree)) /
                           std::max(since(t_step), 1e-12));
  const double loss = a.loss / double(cfg_.train.batch_size * plan_.rows_per_sample);
  if (!std::isfinite(loss)) {  // agreed: every rank sees the summed loss
    progress_->finish();
    report_divergence({.step = step, .what = fmt::format("loss is {}", std::isnan(loss) ? "NaN" : "Inf"),
                       .field = "loss", .value = json_number(loss),
                       .not_written = "no parameters were written"},
                      lead_, lead_ ? metrics_.get() : nullptr);
  }
  step_->update(be_, step);
  return hooks_.end({.step = step, .total = total_, .loss = loss, .agreed = a,
                     .seconds = since(t_step)});
}

// The end of a run that trained every step: the final checkpoint, then (the watchdog off) the
// evaluation of the test split and the parameter file, both only from finite parameters.
int TrainingSession::finish_run(Clock::time_point t_start, double cpu_start) {
  AllocationScope scope("the final checkpoint, evaluation and parameter file");
  if (ckpt_->policy().final_due(publisher_->last_step(), total_))
    publisher_->save(total_, /*wait=*/true);
  publisher_->finish();
  if (mem_) mem_->finish(/*remove=*/true);
  watchdog_->stop();  // collective; the final evaluation and parameter file are not watched
  const double train_s = since(t_start), cpu_s = thread_cpu_seconds() - cpu_start;
  progress_->finish();
  loader_.reset();  // the loader thread owns HDF5 while alive
  PipelineFigures figures;
  if (pipe_) figures = pipeline_figures(comm_, grid_, pipe_->stats(), idle_shares_, plan_.M, plan_.v,
                                              cfg_.parallel.schedule);
  tracer_->write(comm_, cfg_.trace,
                 fmt::format("rank {} · {} · {}", comm_.rank(), grid_.where(), comm_.host()));
  model_->pull(be_);
  opt_->pull(be_);
  publisher_->require_finite(total_);
  // With a pipeline the test set goes through the stages.
  const DatasetInfo& info = plan_.info;
  EvalResult ev;
  if (info.has_test)
    ev = pipe_ ? evaluate_pipelined(*pipe_, be_, info, "test", comm_, grid_, plan_.rows_per_sample)
               : evaluate_replica(*model_, be_, info, "test", comm_, grid_.replica,
                                  grid_.replicas, grid_.tensor == 0, 1000);
  // Finite parameters can still be a diverged model (logits that overflow): its test loss
  // says so, and then nothing is written.
  if (info.has_test && !std::isfinite(ev.loss))
    report_divergence({.step = total_,
                       .what = fmt::format("the test loss is {}", std::isnan(ev.loss) ? "NaN" : "Inf"),
                       .field = "test_loss", .value = "null",
                       .not_written = cfg_.params_path() + " was not written"},
                      lead_, metrics_.get());
  // The parameter file is written from the whole model gathered on rank 0, as a checkpoint.
  Model* final_model = model_.get();
  if (plan_.gathered()) {
    gather_stages(comm_, grid_, plan_.layers, plan_.ranges, *model_, *opt_, whole_.get(),
                  whole_opt_.get(), /*with_state=*/false);
    final_model = whole_.get();
  }
  const RankMemory memory = gather_rank_memory(comm_, *model_, *opt_, cfg_.parallel.zero,
                                               allocs_at_step2_, allocs_at_end_);
  if (lead_) {
    save_parameters(cfg_.params_path(), *final_model,
                    {.config_toml = cfg_.to_toml(), .dataset_sha256 = info.source_sha256,
                     .step = total_, .tokenizer = info.tokenizer});
    const GoodputFigures gp = goodput_->figures();  // the job's goodput so far
    goodput_->finish(/*done=*/true);
    report_done({.cfg = cfg_, .plan = plan_, .step = total_, .steps_run = total_ - start_step_,
                 .train_s = train_s, .cpu_s = cpu_s,
                 .checkpoint_write_s = publisher_->total_write_s(),
                 .allreduce_exposed_s = metrics_hook_->allreduce_exposed_s(),
                 .loader_wait_s = loader_wait_s_, .ev = ev, .figures = figures, .goodput = gp,
                 .memory = memory},
                metrics_.get());
  }
  const int64_t failed = publisher_->agree_failures();
  if (failed > 0) {
    if (lead_)
      fmt::print(stderr, "strata: error: checkpoint.dir {}: {} checkpoint write{} failed during "
                 "the run (each reported above); {} was written, but the run was not "
                 "protected against faults\n", ckpt_->dir(), failed, failed == 1 ? "" : "s",
                 cfg_.params_path());
    return kExitCheckpointsFailed;
  }
  return kExitOk;
}

}  // namespace strata
