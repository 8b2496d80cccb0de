#include "run/train_step.h"

#include <chrono>

namespace strata {

TrainStep::TrainStep(Model& model, Optimizer& opt, GradientAllreducer& reducer,
                     PipelineStage* pipe, const ProcessGrid& grid, Tracer& tracer,
                     int64_t global_batch, bool one_rank,
                     const std::vector<int64_t>* shards)
    : model_(model), opt_(opt), reducer_(reducer), pipe_(pipe), grid_(grid), tracer_(tracer),
      global_batch_(global_batch),
      update_in_backward_(one_rank && !pipe && opt.can_update_in_backward()),
      norm_comm_(grid.stages > 1 || grid.tensors > 1 ? grid.model_comm.get() : nullptr),
      norm_ranges_(model.layout().norm_ranges()), shards_(shards),
      head_(model.classes(), model.rows_per_sample()) {
  allreduce_tied_gradient();
}

double TrainStep::compute(const Backend& be, const Loader::Batch& batch, const StepInfo& si) {
  const auto b = on_be_.put(be, batch);
  const int64_t samples = batch.x.dim(0);  // a language model has T labels each
  if (pipe_) {
    // Every micro-batch's forward and backward, in schedule order; the data-parallel
    // allreduce starts during the last backward. (No before_backward: a stage's first backward
    // may come before a later stage has saved the last step.)
    const double loss = pipe_->run(be, b.x, b.y, samples, si, global_batch_,
                                   [&](int64_t ready) { reducer_.on_grads_ready(ready); });
    Tracer::Scope span(tracer_, "allreduce", "gradient allreduce (stage replicas)");
    reducer_.finish();
    return loss;
  }
  Tracer::Scope span(tracer_, "compute", "forward");
  const Tensor& logits = model_.forward(be, b.x, si);
  return head_.loss_and_gradient(be, logits, b.y, samples, global_batch_, dlogits_);
}

void TrainStep::update(const Backend& be, int64_t step) {
  if (pipe_) {
    share_tied_gradient();
  } else if (update_in_backward_) {
    Tracer::Scope span(tracer_, "compute", "backward + optimizer");
    // The layer's own backward is done with its weights and earlier layers do not read them:
    // the same arithmetic as one update at the end.
    int64_t updated = 0;
    call(hooks_.before_backward);
    call(hooks_.before_update);
    model_.backward(be, dlogits_, 0, [&](int64_t ready) {
      opt_.apply(be, model_.values(), model_.grads(), updated, ready, step);
      updated = ready;
    });
    opt_.end_step();
    call(hooks_.after_update);
    return;
  } else {
    {
      Tracer::Scope span(tracer_, "compute", "backward");
      call(hooks_.before_backward);
      model_.backward(be, dlogits_, 0, [&](int64_t ready) { reducer_.on_grads_ready(ready); });
    }
    Tracer::Scope span(tracer_, "allreduce", "gradient allreduce");
    reducer_.finish();
  }
  {
    Tracer::Scope span(tracer_, "optimizer", "optimizer step");
    call(hooks_.before_update);
    opt_.step(be, model_.values(), model_.grads(), step, norm_comm_, &norm_ranges_,
              shards_ ? grid_.stage_comm.get() : nullptr);
    call(hooks_.after_update);
  }
  if (shards_) {
    Tracer::Scope span(tracer_, "allreduce", "parameter all-gather (ZeRO)");
    const auto t0 = std::chrono::steady_clock::now();
    allgather_shards(*grid_.stage_comm, model_.values().data(), *shards_, reducer_.gate());
    reducer_.count_exposed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

// ZeRO-2 in a pipeline: the token table's gradient on the first and last stage is summed after
// the replicas' reduction, whose shards on the two stages cover different parts of it: its
// buckets are all-reduced.
void TrainStep::allreduce_tied_gradient() {
  if (const Param* t = model_.tied().shared(); t && reducer_.scatters() && pipe_ && grid_.tied_comm)
    reducer_.allreduce_whole(t->offset, t->offset + numel(t->shape));
}

// GPT-2's token table on a pipeline's first and last stage: the embedding's gradient and the
// output layer's, summed (after the replicas' average), so both copies take one update.
void TrainStep::share_tied_gradient() {
  if (model_.tied().shared() && grid_.tied_comm) {
    Tracer::Scope span(tracer_, "allreduce", "token table gradient (first + last stage)");
    model_.tied().share_gradient(*grid_.tied_comm);
  }
}

}  // namespace strata
