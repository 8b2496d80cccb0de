// Evaluation of a model (or a pipeline of stages) on a split of a dataset: each replica on its
// share of every batch, the sums over ranks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "strata/backend.h"
#include "strata/comm.h"

namespace strata {

struct EvalResult {
  double accuracy = 0, loss = 0;  // per row of logits (a language model: per position)
  int64_t samples = 0;
};

// `batch` counts rows of logits (samples x T for a language model), so memory stays the same
// for either. evaluate: each rank of `comm` is a replica holding the whole model.
// batch_seconds: each batch's wall time (forward, loss and count; not the data loading).
EvalResult evaluate(Model& model, const Backend& be, const DatasetInfo& info,
                    const std::string& split, Comm& comm, int64_t batch = 1000,
                    std::vector<double>* batch_seconds = nullptr);
// Replica `replica` of `replicas`; a tensor group's parts all run every batch (the blocks
// exchange partial sums) and only the part that `counts` adds its losses. Sums over `comm`.
EvalResult evaluate_replica(Model& model, const Backend& be, const DatasetInfo& info,
                            const std::string& split, Comm& comm, int replica, int replicas,
                            bool counts, int64_t batch,
                            std::vector<double>* batch_seconds = nullptr);
// The model split into pipeline stages: each replica's pipeline evaluates its share, batch by
// batch, forward only; the last stages' sums are added over `world`. rows_per_sample: the
// whole model's rows of logits per sample.
EvalResult evaluate_pipelined(PipelineStage& pipe, const Backend& be, const DatasetInfo& info,
                              const std::string& split, Comm& world, const ProcessGrid& grid,
                              int64_t rows_per_sample, int64_t batch = 1000);

}  // namespace strata
