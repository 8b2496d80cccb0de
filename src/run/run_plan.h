// What a training run is, agreed by every rank before anything is built: the backend, the
// dataset, the grid's shape, the model's layers and their partition into pipeline stages.
#pragma once
#include <string>
#include <vector>

#include "checkpoint/writer.h"
#include "config/config.h"
#include "data/data.h"
#include "model/model.h"
#include "strata/backend.h"
#include "strata/comm.h"

namespace strata {

struct RunPlan {
  const Backend* be = nullptr;
  std::string device_note;  // what the backend is and why it was chosen, for the log
  // Ranks that share a GPU (more ranks than GPUs on a node): a warning for the log ("" if
  // none): their gradient sums go through host memory instead of NCCL.
  std::string shared_gpus;
  DatasetInfo info;
  int ranks = 1;
  int P = 1, T = 1, D = 1;  // pipeline stages, tensor parts, data-parallel replicas
  int M = 1;                // micro-batches per step
  std::vector<LayerInfo> layers;  // the whole model's
  std::vector<double> costs;      // per layer, what the partition balanced
  std::vector<LayerRange> ranges;  // per virtual stage (P v; stage s: stage_chunks)
  int v = 1;                       // chunks per stage (the interleaved schedule)
  int64_t rows_per_sample = 1;    // rows of logits: 1 for a classifier, T for a language model
  CheckpointWriterChoice writer;   // the checkpoint writer (writer.h), and why
  // Micro-batches without a pipeline are plain gradient accumulation, run by the same engine.
  bool pipelined() const { return P > 1 || M > 1; }
  // Checkpoints and the parameter file are written from the whole model gathered on rank 0
  // when ranks hold different parts of it.
  bool gathered() const { return pipelined() || T > 1; }
  int64_t micro_batch(int64_t global_batch) const { return global_batch / D / M; }
};

// Collective: "ranks 0, 1 share GPU 0 of host n1; ..." for every GPU (this rank's: `gpu`, -1 for
// none) taken by more than one rank of the same host (a node with more ranks than GPUs, or
// launch variables that give every rank the same local rank), else "".
std::string shared_gpus(Comm& comm, int gpu);

// The grid's shape on `ranks` ranks: D = ranks / (P T) data-parallel replicas (P T divides the
// ranks, D the global batch) and M micro-batches per step (dividing each replica's batch).
// Throws UserError naming the key at fault. plan_run checks it; so does `train --check_grid`.

struct GridShape {
  int D = 1, M = 1;
};
GridShape grid_shape(const RunConfig& cfg, int ranks);

// Collective. Validates the config and the job's environment, picks the backend, opens the
// dataset, checks the grid against the rank count and the batch, describes the model and
// refuses one whose largest layer cannot fit, and partitions it (rank 0 measures the layers
// when parallel.balance = "measured"). Throws UserError on every rank after agreeing on it.
RunPlan plan_run(const RunConfig& cfg, Comm& comm);

}  // namespace strata
