#include "run/run_plan.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/job.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "strata/device_comm.h"
#include "strata/error.h"

namespace strata {
namespace {

// The dataset fits the model type, vocabulary, context and batch.
void check_dataset(const RunConfig& cfg, DatasetInfo& info) {
  if (info.tokens != (cfg.model.type == "gpt"))
    fail_input("{}: holds {}, which model.type = \"{}\" does not take ({})", cfg.data.path,
               info.tokens ? "tokens" : "images", cfg.model.type,
               info.tokens ? "a token file trains model.type = \"gpt\"" : "a GPT trains on tokens: strata prepare text");
  if (info.tokens) {
    if (cfg.model.vocab != 0 && cfg.model.vocab != info.vocab)
      fail_input("model.vocab = {}{}, but {} has a vocabulary of {}", cfg.model.vocab,
                 cfg.model.preset == "none" ? "" : fmt::format(" (model.preset = \"{}\")", cfg.model.preset),
                 cfg.data.path, info.vocab);
    set_context(info, cfg.model.context);
  }
  if (cfg.train.batch_size > info.train.n)
    fail_input("train.batch_size = {} is larger than the {} training samples in {}",
               cfg.train.batch_size, info.train.n, cfg.data.path);
}

// The grid's shape (grid_shape) and what the backend allows of it.
void check_grid(const RunConfig& cfg, RunPlan& p) {
  const GridShape g = grid_shape(cfg, p.ranks);
  p.D = g.D;
  p.M = g.M;

  if (p.T > 1 && !p.be->host_memory())
    fail_input("parallel.tensor = {}: tensor parallelism runs on the CPU for now (use "
               "--device cpu)", p.T);
}

}  // namespace

GridShape grid_shape(const RunConfig& cfg, int ranks) {
  const int P = cfg.parallel.pipeline_stages, T = cfg.parallel.tensor;
  const int D = data_parallel_width(ranks, P, T, cfg.train.batch_size);
  // (One replica is allowed where the device communicator is asked to run its collectives
  // alone: the GPU check's ZeRO-2 on a one-rank NCCL communicator.)
  if (cfg.parallel.zero > 0 && D < 2 && !device_collectives_on_one_rank())
    fail_input("parallel.zero = {}: shards over the data-parallel replicas, and this grid has "
               "one (D = {} ranks / ({} stages x {} tensor parts) = 1): run on more ranks or "
               "set parallel.zero = 0", cfg.parallel.zero, ranks, P, T);
  const bool interleaved = cfg.parallel.schedule == "interleaved";
  const int v = cfg.parallel.virtual_stages;
  if (interleaved && P < 2)
    fail_input("parallel.schedule = \"interleaved\" needs parallel.pipeline_stages >= 2 (it has {})", P);
  if (interleaved && v < 2)
    fail_input("parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2 (model "
               "chunks per stage; it is {})", v);
  if (!interleaved && v != 1)
    fail_input("parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (it is "
               "\"{}\")", v, cfg.parallel.schedule);
  const int M = resolve_microbatches(cfg.parallel.microbatches, P, cfg.train.batch_size, D, interleaved);
  // Each (chunk, micro-batch) has its own message tags, kept below the evaluation's.
  if (int64_t(v) * M > 8192)
    fail_input("parallel.virtual_stages x parallel.microbatches = {} x {} = {}: at most 8192 "
               "chunk-micro-batches per step", v, M, int64_t(v) * M);
  return {.D = D, .M = M};
}

std::string shared_gpus(Comm& comm, int gpu) {
  const auto all = comm.all_gather_text(gpu < 0 ? "" : fmt::format("GPU {} of host {}", gpu, comm.host()));
  std::map<std::string, std::vector<int>> by_gpu;
  for (int r = 0; r < int(all.size()); ++r)
    if (!all[size_t(r)].empty()) by_gpu[all[size_t(r)]].push_back(r);
  std::string out;
  for (const auto& [where, ranks] : by_gpu)
    if (ranks.size() > 1)
      out += fmt::format("{}ranks {} share {}", out.empty() ? "" : "; ", fmt::join(ranks, ", "), where);
  return out;
}

RunPlan plan_run(const RunConfig& cfg, Comm& comm) {
  const bool lead = comm.rank() == 0;
  RunPlan p;
  p.ranks = comm.size();
  int gpu = -1;
  p.P = cfg.parallel.pipeline_stages;
  p.T = cfg.parallel.tensor;
  collectively(comm, [&] {
    validate(cfg);
    check_job_environment();
    p.be = &select_backend({.device = cfg.device, .threads = cfg.threads,
                            .precision = cfg.train.precision}, &p.device_note, &gpu);
    check_grid(cfg, p);
    p.writer = choose_checkpoint_writer(cfg, p.T, comm);
    p.info = open_dataset(cfg.data.path, {.format = cfg.data.format, .val_path = cfg.data.val_path,
                                          .vocab = cfg.model.vocab, .check_part = comm.rank(),
                                          .check_parts = comm.size()});
    check_dataset(cfg, p.info);
    p.layers = describe_layers(cfg.model_spec(p.info.classes), p.info.train.sample_shape,
                                      p.info.classes);
    // Whatever the partition, one rank holds the largest layer whole (its tensor part of it).
    int largest = 0;
    for (int i = 0; i < int(p.layers.size()); ++i)
      if (p.layers[size_t(i)].params > p.layers[size_t(largest)].params) largest = i;
    require_model_memory(p.layers, {largest, largest + 1}, cfg.train.optimizer == "adamw" ? 4 : 3,
                         p.T, cfg.train.batch_size / p.D, fmt::format("rank {}", comm.rank()));
  });
  p.shared_gpus = shared_gpus(comm, gpu);
  // The partition: rank 0 measures when asked (every rank must use the same costs).
  p.costs = estimated_costs(p.layers);
  if (p.P > 1 && cfg.parallel.stage_layers.empty() && cfg.parallel.balance == "measured") {
    if (lead)
      p.costs = measured_costs(cfg.model_spec(p.info.classes), p.info.train.sample_shape,
                               p.info.classes, *p.be, p.micro_batch(cfg.train.batch_size), 5);
    comm.broadcast(p.costs.data(), int64_t(p.costs.size() * sizeof(double)), 0);
  }
  collectively(comm, [&] {
    // P v virtual stages (interleaved: stage s holds every P-th of them, from s).
    p.v = cfg.parallel.virtual_stages;
    p.ranges = partition_layers(p.layers, p.costs, p.P, cfg.parallel.stage_layers, p.v);
  });
  p.rows_per_sample = numel(p.layers.back().out_shape) / p.info.classes;
  return p;
}

}  // namespace strata
