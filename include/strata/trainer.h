// The training loop every rank runs, and evaluation.
#pragma once
#include <functional>
#include <string>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/data.h"

namespace strata {

// Trains as configured; returns an exit code (kExitOk, kExitDiverged). Throws UserError for
// bad input, after every rank agreed on it (no rank is left waiting in a collective).
int run_train(const RunConfig& cfg, Comm& comm);

struct EvalResult {
  double accuracy = 0, loss = 0;
  int64_t samples = 0;
};
// Evaluates on a split, each rank on its share; results are summed over ranks. `batch` counts
// rows of logits (samples x T for a language model), so memory stays the same for either.
EvalResult evaluate(Model& model, const Backend& be, const DatasetInfo& info,
                    const std::string& split, Comm& comm, int64_t batch = 1000);

// The same with the model split into pipeline stages: each replica's pipeline evaluates its
// share, batch by batch, forward only; the last stages' sums are added over `world`.
// rows_per_sample: the whole model's rows of logits per sample (T for a language model).
class PipelineStage;
struct ProcessGrid;
EvalResult evaluate_pipelined(PipelineStage& pipe, const Backend& be, const DatasetInfo& info,
                              const std::string& split, Comm& world, const ProcessGrid& grid,
                              int64_t rows_per_sample, int64_t batch = 1000);

}  // namespace strata
