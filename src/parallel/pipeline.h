// Pipeline model parallelism: the model's layers split into stages, each mini-batch into
// micro-batches that flow through them.
//
//   partition_layers   which layers each stage holds: balanced by estimated cost, or explicit
//   pipeline_schedule  the order of one stage's forwards and backwards in a step
//                      (pipeline_schedule.h: gpipe, 1f1b, zb-h1, zb-h2, interleaved)
//   PipelineStage      runs one step of that order on this rank: non-blocking sends and
//                      receives of activations (forward) and their gradients (backward) to
//                      the neighbour stages, the loss on the last stage, gradients summed
//                      over micro-batches
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/trace.h"
#include "model/loss.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "parallel/pipeline_schedule.h"
#include "strata/backend.h"
#include "strata/comm.h"

namespace strata {

// Per-layer cost of a training step, in any unit (parallel.balance):
//  estimated  forward FLOPs x 3 (forward and backward), x 2 for the lowest layer with
//             parameters (it computes no input gradient); a layer without FLOPs costs its
//             output size in elements
//  measured   seconds of forward + backward of one micro-batch of `batch` samples on this
//             rank, the median of `reps` runs after a warm-up (layers with the same shapes
//             cost the same everywhere, so one rank measures for all)
std::vector<double> estimated_costs(const std::vector<LayerInfo>& layers);
std::vector<double> measured_costs(const ModelSpec& spec, const Shape& input_shape, int classes,
                                   const Backend& be, int64_t batch, int reps);
// Layer ranges, one per chunk of each stage (stages x chunks in layer order; chunks > 1:
// interleaved). explicit_counts empty: contiguous ranges minimising the costliest range's
// cost. Otherwise the counts of layers per range. Throws UserError naming the keys.
std::vector<LayerRange> partition_layers(const std::vector<LayerInfo>& layers,
                                         const std::vector<double>& costs, int stages,
                                         const std::vector<int>& explicit_counts, int chunks = 1);
// One line per stage (per chunk when there are more ranges than stages): its layers,
// parameters and share of the cost.
std::string partition_summary(const std::vector<LayerInfo>& layers,
                              const std::vector<double>& costs,
                              const std::vector<LayerRange>& ranges, int stages);

// Micro-batches per step: `configured`, which must divide the per-replica batch G/D, or for 0
// the largest divisor of it up to 4 P (enough to keep the bubble small; 1 without a
// pipeline); a multiple of P for the interleaved schedule. Throws UserError naming
// parallel.microbatches.
int resolve_microbatches(int configured, int stages, int64_t global_batch, int replicas,
                         bool interleaved = false);

struct PipelineStats {
  int peak_live = 0;            // most micro-batches between forward and backward (its W) at once
  int64_t peak_act_bytes = 0;   // their activations at that moment
  int64_t max_slot_bytes = 0;   // the most one micro-batch (interleaved: one chunk of one) held
  double wait_s = 0;            // waiting for neighbours (receives, and sends at step end)
};

class PipelineStage {
 public:
  // pipe: the pipeline communicator (rank = stage). micros divides every batch run() gets.
  PipelineStage(Model& model, Comm& pipe, int stages, int micros, const std::string& schedule,
                Tracer& tracer);
  // One step over this replica's batch (x read on the first stage, labels on the last):
  // every micro-batch forward and backward in schedule order. Parameter gradients are
  // overwritten by the first micro-batch and summed over the rest (dlogits scaled by
  // 1/global_batch, so the sum is the mini-batch mean). on_ready is the model's gradient
  // callback during the last micro-batch's backward, its W when split (the data-parallel
  // allreduce starts then); interleaved, during each chunk's last (the later chunk's
  // gradients come first in the flat buffers and finish first). Returns the sum of the per-sample losses on the last stage, 0 elsewhere.
  double run(const Backend& be, const Tensor& x, const int32_t* labels, int64_t batch,
             const StepInfo& si, int64_t global_batch,
             const std::function<void(int64_t)>& on_ready);
  // Forward only, the whole batch at once (evaluation): the first stage reads x, each stage
  // passes its output on; the last returns {sum of per-sample losses, correct predictions},
  // the others {0, 0}. Collective over the pipeline.
  std::pair<double, int64_t> forward_only(const Backend& be, const Tensor& x,
                                          const int32_t* labels, int64_t batch);
  const PipelineStats& stats() const { return stats_; }

 private:
  // Each op on chunk c (0 but for interleaved) of micro-batch m.
  double forward(int c, int m);      // F: returns the micro-batch's loss sum on the last stage
  void backward(int c, int m);       // B
  void weight_grads(int c, int m);   // W (split schedules)
  void retire(int c, int slot);      // the micro-batch's backward is done: its slot is free
  void post_next_recv();
  int alloc_slot(int c);
  void release_slot(int c, int slot);
  void post_input_recv(int c, int m);
  std::string span_name(const char* what, int c, int m) const;
  // The model's first and last virtual stage; a (chunk, micro-batch)'s index in the vectors.
  bool first(int c) const { return stage_ == 0 && c == 0; }
  bool last(int c) const { return stage_ == stages_ - 1 && c == chunks_ - 1; }
  size_t at(int c, int m) const { return size_t(c * micros_ + m); }
  void progress();  // lets MPI move messages in flight while this rank computes
  // Waits for a transfer (counted as idle, traced as `cat`); a handle < 0 is done already.
  void wait(int& handle, const char* cat, const char* what, int m);

  Model& model_;
  Comm& pipe_;
  const Memory* mem_ = &host_memory();  // the backend's, for the buffers below (set by run)
  int stage_, stages_, micros_, chunks_;
  int next_ = 0, prev_ = 0;  // the neighbour ranks (round the ring: interleaved)
  bool split_ = false;  // B and W apart (zero-bubble schedules)
  Tracer* tracer_;
  // The step run() is in.
  struct Step {
    const Backend* be = nullptr;
    const Tensor* x = nullptr;
    const int32_t* labels = nullptr;
    int64_t bm = 0;  // samples per micro-batch
    const StepInfo* si = nullptr;
    int64_t global_batch = 0;
    const std::function<void(int64_t)>* on_ready = nullptr;
  } step_;
  std::vector<int> backwards_, weights_;  // per chunk, B's and W's done this step
  std::vector<PipeOp> ops_;
  SoftmaxXentHead head_;  // the last stage's loss
  // Per activation slot: the stage's input (received), the gradient at its output
  // (received, or dlogits on the last stage), and sends not yet complete.
  std::deque<Tensor> in_, dout_;  // a deque: the model keeps pointers to in_[slot]
  Tensor eval_in_;
  std::vector<std::vector<int>> sends_;
  std::vector<std::vector<int>> free_slots_;  // per chunk
  std::vector<int> slots_;                    // per chunk, slots made
  std::vector<int> slot_of_, recv_in_, recv_grad_;  // per (chunk, micro-batch); -1 = none or done
  std::vector<int64_t> slot_bytes_;
  int64_t live_bytes_ = 0;
  int next_recv_ = 0;  // index into ops_ of the next forward whose input receive is not posted
  int live_ = 0;
  std::vector<int> max_live_;  // per chunk, the schedule's bound on live micro-batches (slots: one more)
  PipelineStats stats_;
};

// A run's per-stage figures, on every rank (collective over `world`): the most micro-batches
// alive at once (max over replicas), their activation memory, and the idle share (the median
// of this rank's per-step shares, mean over replicas), beside the schedule's theory
// (schedule_idle_shares: per stage, and their mean) and its bound on live micro-batches.
struct PipelineFigures {
  std::vector<double> peak_live, peak_mb, micro_mb, idle, theory_idle, bound_live;
  double theory = 0;
};
PipelineFigures pipeline_figures(Comm& world, const ProcessGrid& grid, const PipelineStats& stats,
                                 std::vector<double> idle_shares, int micros, int chunks,
                                 const std::string& schedule);
// "[a, b, c]" with `decimals` digits after the point (metrics and reports).
std::string json_list(const std::vector<double>& v, int decimals);

}  // namespace strata
