// One training step, whatever the grid: this rank's micro-batches through its stage (forward,
// loss, backward), the data-parallel gradient reduction, and, once every rank has agreed that
// the loss is finite (the session's per-step agreement), the update. Its two halves sit on
// either side of that agreement:
//   compute()  forward and loss; in a pipeline (or with micro-batches) also every backward and
//              the gradient allreduce, since a stage interleaves them with its neighbours'
//   update()   the rest: without a pipeline the backward and its allreduce, then the update
// Without a pipeline, backward waits for the agreement: a diverged step costs no backward, and
// on one rank without clipping the optimizer updates each layer's parameters as soon as
// backward has produced their gradients, while those are still in cache.
#pragma once
#include <functional>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/trace.h"
#include "data/data.h"
#include "model/batch_on_backend.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "strata/backend.h"

namespace strata {

class TrainStep {
 public:
  // pipe: this rank's stage when the run is pipelined (stages or micro-batches), else null.
  // one_rank: the whole run is this one rank.
  // shards: with ZeRO, each replica's shard size of the flat buffer (zero.h; the optimizer
  // owns this replica's); null without.
  TrainStep(Model& model, Optimizer& opt, GradientAllreducer& reducer, PipelineStage* pipe,
            const ProcessGrid& grid, Tracer& tracer, int64_t global_batch, bool one_rank,
            const std::vector<int64_t>* shards = nullptr);
  // This rank's sum of per-row losses over its share of the batch (0 on a stage without the
  // loss).
  double compute(const Backend& be, const Loader::Batch& batch, const StepInfo& si);
  // The rest of step `step` (0-based), after every rank agreed the loss is finite.
  void update(const Backend& be, int64_t step);
  // Memory checkpoints' hooks: before the step's first backward writes a gradient, once every
  // rank has finished the step before (they may move the gradients; not in a pipeline, whose
  // stages start backward at different times); before the update changes parameters or
  // optimizer state (they copy them in the background until then, or point the update at
  // their next generation); and after it.
  struct UpdateHooks {
    std::function<void()> before_backward, before_update, after_update;
  };
  void set_update_hooks(UpdateHooks h) { hooks_ = std::move(h); }
  // Seconds this rank has waited for pipeline neighbours so far (0 without a pipeline).
  double pipeline_wait_s() const { return pipe_ ? pipe_->stats().wait_s : 0.0; }

 private:
  void share_tied_gradient();
  static void call(const std::function<void()>& hook) {
    if (hook) hook();
  }
  void allreduce_tied_gradient();

  Model& model_;
  Optimizer& opt_;
  GradientAllreducer& reducer_;
  PipelineStage* pipe_;
  const ProcessGrid& grid_;
  Tracer& tracer_;
  int64_t global_batch_;
  bool update_in_backward_;
  // The global gradient norm (clipping) sums the squares of every rank of a replica's model,
  // each parameter counted once.
  Comm* norm_comm_;
  std::vector<FlatPieces> norm_ranges_;
  const std::vector<int64_t>* shards_;  // ZeRO's (the session's); null without
  BatchOnBackend on_be_;
  SoftmaxXentHead head_;
  Tensor dlogits_;
  UpdateHooks hooks_;
};

}  // namespace strata
