#include "run/memory_estimate.h"

#include <algorithm>

#include <fmt/format.h>

#include "parallel/pipeline_schedule.h"

namespace strata {
namespace {

constexpr double kFloat = sizeof(float);

// Transformer blocks are the layers that keep internal activations: they alone are split
// over the tensor-parallel ranks.
bool is_block(const LayerInfo& l) { return l.internal_bytes > 0; }

// Floats of one layer's parameters on a rank (its flat span: each tensor padded).
double layer_floats(const LayerInfo& l, int tensor_parts) {
  return double(l.flat) / (is_block(l) ? tensor_parts : 1);
}

// One micro-batch's activations kept in a slot (model.cpp): every layer's output, the
// gradient at every layer's input that backward forms (reshapes: views, nothing) (none below the first stage's lowest
// layer with parameters), the blocks' internal activations unless recomputed.
double slot_bytes(const std::vector<LayerInfo>& layers, LayerRange c, const RankShape& r) {
  double floats = 0;
  const int last = c.last < 0 ? int(layers.size()) : c.last;
  bool input_grads = c.first > 0;
  for (int i = c.first; i < last; ++i) {
    const LayerInfo& l = layers[size_t(i)];
    if (!l.reshape) floats += double(numel(l.out_shape));
    if (input_grads && !l.reshape) floats += double(numel(l.in_shape));
    input_grads = input_grads || l.params > 0;
    if (is_block(l) && !r.recompute) floats += double(l.internal_bytes) / kFloat / r.tensor_parts;
  }
  return kFloat * floats * double(r.micro_batch);
}

// The scratch every block shares (layers_gpt.cpp's BlockWorkspace): per position 4 C
// floats at the stream's width, two MLP-wide (4 C / T) and one q, k, v (3 C / T); under
// recompute also one block's input copy and internal activations.
double block_workspace_bytes(const std::vector<LayerInfo>& layers, const RankShape& r) {
  double most = 0;
  for (const LayerInfo& l : layers) {
    if (!is_block(l) || l.in_shape.size() != 2) continue;
    const double T = double(l.in_shape[0]), C = double(l.in_shape[1]), parts = r.tensor_parts;
    double floats = T * C * (4 + 11 / parts);
    if (r.recompute) floats += T * C + double(l.internal_bytes) / kFloat / parts;
    most = std::max(most, floats);
  }
  return kFloat * most * double(r.micro_batch);
}

}  // namespace

ParameterCount count_parameters(const std::vector<LayerInfo>& layers) {
  ParameterCount n;
  for (const LayerInfo& l : layers) {
    n.allocated += l.params;
    n.used += l.params - l.padding;
  }
  return n;
}

MemoryEstimate estimate_rank_memory(const std::vector<LayerInfo>& layers, const RankShape& r) {
  MemoryEstimate m;
  double floats = 0, whole = 0, most_slot = 0, unsplit = 0;
  for (const LayerRange& c : r.chunks) {
    const int last = c.last < 0 ? int(layers.size()) : c.last;
    for (int i = c.first; i < last; ++i) {
      floats += layer_floats(layers[size_t(i)], r.tensor_parts);
      unsplit += double(layers[size_t(i)].flat);
    }
    most_slot = std::max(most_slot, slot_bytes(layers, c, r));
  }
  if (r.tied_copy && !layers.empty()) floats += double(layers.front().flat);
  for (const LayerInfo& l : layers) whole += double(l.flat);
  m.parameters = kFloat * floats;
  m.gradients = kFloat * floats;
  m.optimizer = kFloat * floats * r.optimizer_states / (r.zero >= 1 ? r.replicas : 1);
  // The loss's softmax and its gradient: one micro-batch's logits, twice.
  const double loss = r.last_stage ? 2 * kFloat * double(r.micro_batch * r.rows_per_sample * r.classes) : 0;
  m.activations = most_slot * r.live_microbatches + loss;
  m.workspace = block_workspace_bytes(layers, r) + kRuntimeBytes;
  m.communication = kFloat * double(r.received_input + r.received_gradient) * double(r.micro_batch) *
                    r.live_microbatches;
  if (r.whole_model) m.whole_model = kFloat * whole * (2 + r.optimizer_states);
  // Tensor parts: to gather, part 0 also receives the other parts' blocks (a buffer each)
  // and assembles its stage's block unsplit (whole_model.cpp): the parameter file's gather, at
  // the end of every run. A checkpoint with optimizer state assembles its buffers too.
  if (r.whole_model && r.tensor_parts > 1)
    m.whole_model += kFloat * ((r.tensor_parts - 1) * floats + unsplit);
  return m;
}

PlannedMemory estimate_run_memory(const RunConfig& cfg, const RunPlan& plan) {
  return estimate_run_memory(
      cfg, plan,
      plan.pipelined() ? schedule_theory(cfg.parallel.schedule, plan.P, plan.M, plan.v) : ScheduleTheory{});
}

PlannedMemory estimate_run_memory(const RunConfig& cfg, const RunPlan& plan,
                                  const ScheduleTheory& theory, bool device_only) {
  PlannedMemory best;
  for (int s = 0; s < plan.P; ++s) {
    const std::vector<LayerRange> chunks = stage_chunks(plan.ranges, plan.P, s);
    RankShape r{.chunks = chunks, .tensor_parts = plan.T,
                .replicas = plan.D, .zero = cfg.parallel.zero,
                .optimizer_states = cfg.train.optimizer == "adamw" ? 2 : 1,
                .micro_batch = plan.micro_batch(cfg.train.batch_size),
                .live_microbatches = theory.live.empty() ? 1 : theory.live[size_t(s)],
                .recompute = cfg.train.recompute == "block", .last_stage = s == plan.P - 1,
                .tied_copy = plan.P > 1 && s == plan.P - 1 && plan.info.tokens,
                .whole_model = plan.gathered() && s == 0 && !device_only, .classes = plan.info.classes,
                .rows_per_sample = plan.rows_per_sample};
    // Each chunk's slot receives its input (but the model's first chunk) and its output's
    // gradient (but the last's): interleaved chunks are 1/v of a stage, so the largest counts.
    for (const LayerRange& c : chunks) {
      const int last = c.last < 0 ? int(plan.layers.size()) : c.last;
      if (c.first > 0) r.received_input = std::max(r.received_input, numel(plan.layers[size_t(c.first)].in_shape));
      if (last < int(plan.layers.size()))
        r.received_gradient = std::max(r.received_gradient, numel(plan.layers[size_t(last - 1)].out_shape));
    }
    MemoryEstimate e = estimate_rank_memory(plan.layers, r);
    // The pairwise sums on MPI (comm/pairwise.h) receive the other D - 1 ranks' parts of this
    // rank's shard of each bucket into a staging buffer kept per bucket in flight, and every
    // bucket is in flight until backward ends (or, without overlap, after it): (D - 1) / D of
    // the gradient buffer, kept per bucket from step to step. NCCL sums in place.
    if (plan.D > 1 && !device_only) e.communication += e.gradients * double(plan.D - 1) / double(plan.D);
    if (s == 0 || e.total() > best.estimate.total()) best = {s, e};
  }
  return best;
}

std::string thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string describe_memory(const ParameterCount& n, const PlannedMemory& m, const RunPlan& plan) {
  const MemoryEstimate& e = m.estimate;
  auto gb = [](double b) { return fmt::format("{:.2f}", b / 1e9); };
  std::string where = plan.P > 1 ? fmt::format(" (stage {}, the most)", m.stage) : "";
  std::string out = fmt::format(
      "{} parameters{}; memory per rank, estimated before allocating: {} GB{} = parameters {} + "
      "gradients {} + optimizer state {} + activations {} + workspace {}{}",
      thousands(n.used),
      n.allocated != n.used ? fmt::format(" ({} allocated: the token table's padding rows)",
                                          thousands(n.allocated))
                            : "",
      gb(e.total()), where, gb(e.parameters), gb(e.gradients), gb(e.optimizer),
      gb(e.activations), gb(e.workspace),
      e.communication > 0 ? " + communication buffers " + gb(e.communication) : "");
  if (e.whole_model > 0) out += fmt::format(" + the whole model gathered on rank 0 {}", gb(e.whole_model));
  return out;
}

std::string plan_line(const RunConfig& cfg, const RunPlan& plan) {
  return "plan: " + describe_memory(count_parameters(plan.layers), estimate_run_memory(cfg, plan), plan);
}

}  // namespace strata
