#include "parallel/pipeline.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "strata/error.h"
#include "strata/rng.h"

namespace strata {

std::vector<double> estimated_costs(const std::vector<LayerInfo>& layers) {
  std::vector<double> c;
  bool below_params = true;  // no layer with parameters yet
  for (const LayerInfo& l : layers) {
    const bool lowest = below_params && l.params > 0;
    if (l.params > 0) below_params = false;
    c.push_back(l.flops > 0 ? l.flops * (lowest ? 2.0 : 3.0) : double(numel(l.out_shape)));
  }
  return c;
}

std::vector<double> measured_costs(const ModelSpec& spec, const Shape& input_shape, int classes,
                                   const Backend& be, int64_t batch, int reps) {
  // The whole model on this rank, but as if a later stage: every layer computes its input
  // gradient, as all but the first stage's do (the first stage's lowest layer costs a little
  // less than measured).
  Model m(spec, input_shape, classes);
  m.init(1);
  m.place(be);
  Tensor hx(batched(batch, input_shape)), hdy(batched(batch, m.stage_output_shape()));
  Rng rng(7);
  for (int64_t i = 0; i < hx.size(); ++i) hx.data()[i] = rng.uniform(0.f, 1.f);
  for (int64_t i = 0; i < hdy.size(); ++i) hdy.data()[i] = rng.uniform(-1e-3f, 1e-3f);
  const Tensor x = to_backend(be, hx), dy = to_backend(be, hdy);
  const size_t L = m.layers().size();
  std::vector<std::vector<double>> runs;
  StepInfo si{.training = true};
  for (int r = 0; r <= reps; ++r) {  // run 0 warms caches and allocations up
    std::vector<double> t(L, 0.0);
    m.set_profile(&t);
    m.forward(be, x, si);
    m.backward(be, dy, 0);
    m.set_profile(nullptr);
    if (r > 0) runs.push_back(t);
  }
  std::vector<double> c(L);
  for (size_t i = 0; i < L; ++i) {
    std::vector<double> v;
    for (auto& t : runs) v.push_back(t[i]);
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    c[i] = v[v.size() / 2];
  }
  return c;
}

std::vector<LayerRange> partition_layers(const std::vector<LayerInfo>& layers,
                                         const std::vector<double>& costs, int pipeline_stages,
                                         const std::vector<int>& counts, int chunks) {
  STRATA_CHECK(costs.size() == layers.size(), "{} costs for {} layers", costs.size(), layers.size());
  const int L = int(layers.size()), stages = pipeline_stages * chunks;  // the ranges
  const char* part = chunks > 1 ? "chunk" : "stage";
  if (stages > L && chunks > 1)
    fail_input("parallel.pipeline_stages x parallel.virtual_stages = {} x {} = {} chunks, but the "
               "model has {} layers (as the model summary lists them, fused layers once); every "
               "chunk needs at least one", pipeline_stages, chunks, stages, L);
  if (stages > L)
    fail_input("parallel.pipeline_stages = {} but the model has {} layers (as the model summary "
               "lists them, fused layers once); every stage needs at least one", stages, L);
  std::vector<LayerRange> out;
  if (!counts.empty()) {
    if (int(counts.size()) != stages && chunks > 1)
      fail_input("parallel.stage_layers has {} entries; interleaved, it needs one per chunk: "
                 "parallel.pipeline_stages x parallel.virtual_stages = {}", counts.size(), stages);
    if (int(counts.size()) != stages)
      fail_input("parallel.stage_layers has {} entries; parallel.pipeline_stages is {}",
                 counts.size(), stages);
    int at = 0;
    for (int s = 0; s < stages; ++s) {
      if (counts[size_t(s)] <= 0)
        fail_input("parallel.stage_layers: {} {} gets {} layers; every {} needs at least one",
                   part, s, counts[size_t(s)], part);
      out.push_back({at, at + counts[size_t(s)]});
      at += counts[size_t(s)];
    }
    if (at != L)
      fail_input("parallel.stage_layers covers {} layers; the model has {} (see the model "
                 "summary: fused layers count once)", at, L);
    return out;
  }
  // Costs, then the contiguous split into `stages` parts whose costliest part is cheapest
  // (exact, by dynamic programming: L and P are small).
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + costs[size_t(i)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][j]: for layers [0, j) in k stages, the cheapest costliest stage, then (among
  // splits within 1% of it: the costs are estimates) the smallest sum of squared stage costs,
  // so that cheap layers spread over the stages rather than leaving one nearly empty (a
  // flatten alone); cut[k][j]: where the last stage starts.
  struct Score {
    double max, sumsq;
    bool operator<(const Score& o) const {
      const double tol = 0.01 * std::min(max, o.max);
      return max < o.max - tol || (max <= o.max + tol && sumsq < o.sumsq);
    }
  };
  std::vector<std::vector<Score>> best(size_t(stages) + 1,
                                       std::vector<Score>(size_t(L) + 1, Score{inf, inf}));
  std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(L) + 1, 0));
  best[0][0] = {0, 0};
  for (int k = 1; k <= stages; ++k)
    for (int j = k; j <= L; ++j)
      for (int i = k - 1; i < j; ++i) {
        const Score& prev = best[size_t(k) - 1][size_t(i)];
        const double seg = prefix[size_t(j)] - prefix[size_t(i)];
        const Score c{std::max(prev.max, seg), prev.sumsq + seg * seg};
        if (c < best[size_t(k)][size_t(j)]) {
          best[size_t(k)][size_t(j)] = c;
          cut[size_t(k)][size_t(j)] = i;
        }
      }
  out.resize(size_t(stages));
  for (int k = stages, j = L; k >= 1; --k) {
    const int i = cut[size_t(k)][size_t(j)];
    out[size_t(k) - 1] = {i, j};
    j = i;
  }
  return out;
}

int resolve_microbatches(int configured, int stages, int64_t global_batch, int replicas,
                         bool interleaved) {
  const int64_t per_replica = global_batch / replicas;
  const int step = interleaved ? stages : 1;  // the interleaved schedule takes P at a time
  if (configured == 0) {
    for (int m = stages == 1 ? 1 : 4 * stages; m > 1; --m)
      if (per_replica % m == 0 && m % step == 0) return m;
    if (step == 1) return 1;
    fail_input("parallel.schedule = \"interleaved\" needs a multiple of parallel.pipeline_stages "
               "= {} micro-batches, and none up to {} divides the per-replica batch of {} "
               "(train.batch_size = {} over {} replica{})", stages, 4 * stages, per_replica,
               global_batch, replicas, replicas == 1 ? "" : "s");
  }
  if (per_replica % configured != 0)
    fail_input("parallel.microbatches = {} does not divide the per-replica batch of {} "
               "(train.batch_size = {} over {} replica{})", configured, per_replica,
               global_batch, replicas, replicas == 1 ? "" : "s");
  if (configured % step != 0)
    fail_input("parallel.microbatches = {} is not a multiple of parallel.pipeline_stages = {}, "
               "which parallel.schedule = \"interleaved\" needs", configured, stages);
  return configured;
}

namespace {
// Messages of different micro-batches, chunks and directions never share a tag: a message
// carries the (chunk, micro-batch) of its receiver. Evaluation has its own (grid_shape keeps
// chunks x micro-batches at most 8192, so training tags stay below 16384; MPI allows 32767).
int tag_of(int chunk, int m, int micros, bool backward) { return 2 * (chunk * micros + m) + (backward ? 1 : 0); }
constexpr int kEvalTag = 30000;
}  // namespace

PipelineStage::PipelineStage(Model& model, Comm& pipe, int stages, int micros,
                             const std::string& schedule, Tracer& tracer)
    : model_(model), pipe_(pipe), stage_(pipe.rank()), stages_(stages), micros_(micros),
      chunks_(model.chunks()), tracer_(&tracer),
      head_(model.classes(), model.rows_per_sample()) {
  STRATA_CHECK(pipe.size() == stages, "pipeline communicator of {} ranks for {} stages", pipe.size(), stages);
  STRATA_CHECK(chunks_ * micros_ <= 8192, "{} chunks x {} micro-batches", chunks_, micros_);
  ops_ = pipeline_schedule(schedule, stages_, stage_, micros_, chunks_);
  next_ = (stage_ + 1) % stages_;
  prev_ = (stage_ + stages_ - 1) % stages_;
  split_ = splits_backward(schedule);
  free_slots_.resize(size_t(chunks_));
  slots_.assign(size_t(chunks_), 0);
  // Per chunk, the most of its micro-batches the schedule keeps alive.
  for (int c = 0; c < chunks_; ++c) {
    std::vector<PipeOp> mine;
    for (const PipeOp& o : ops_)
      if (o.chunk == c) mine.push_back(o);
    max_live_.push_back(schedule_peak_live(mine));
  }
}

int PipelineStage::alloc_slot(int c) {
  // A free slot of this chunk whose sends have completed; else one more slot than the
  // schedule keeps alive (the neighbour may be computing and not take a message for a while:
  // waiting for it would add to this stage's idle time); else wait for the oldest free slot's
  // sends. Slots are per chunk: a slot keeps its chunk's layers' buffers.
  auto sent = [&](int k) {
    bool done = true;
    for (int& h : sends_[size_t(k)]) {
      if (h >= 0 && pipe_.test(h)) h = -1;
      done = done && h < 0;
    }
    return done;
  };
  std::vector<int>& free = free_slots_[size_t(c)];
  int slot = -1;
  for (size_t i = 0; i < free.size(); ++i)
    if (sent(free[i])) {
      slot = free[i];
      free.erase(free.begin() + long(i));
      break;
    }
  if (slot < 0 && !free.empty() && slots_[size_t(c)] >= max_live_[size_t(c)] + 1) {
    slot = free.front();
    free.erase(free.begin());
  }
  if (slot < 0) {
    slot = int(in_.size());
    ++slots_[size_t(c)];
    in_.emplace_back();
    dout_.emplace_back();
    sends_.emplace_back();
    slot_bytes_.push_back(0);
  }
  // Sends from this slot's buffers must finish before they are overwritten.
  for (int& h : sends_[size_t(slot)]) wait(h, "send", "wait for a send", -1);
  sends_[size_t(slot)].clear();
  return slot;
}

void PipelineStage::release_slot(int c, int slot) { free_slots_[size_t(c)].push_back(slot); }

void PipelineStage::post_input_recv(int c, int m) {
  const int slot = alloc_slot(c);
  slot_of_[at(c, m)] = slot;
  in_[size_t(slot)].resize(batched(step_.bm, model_.chunk_input_shape(c)), *mem_);
  recv_in_[at(c, m)] = pipe_.start_recv(in_[size_t(slot)].data(), in_[size_t(slot)].size(),
                                         prev_, tag_of(c, m, micros_, false));
}

// MPI moves a message only inside MPI calls; testing what is in flight between operations
// lets a large (rendezvous) send proceed while this rank computes the next micro-batch.
// A handle that completes is given back to the communicator, so it is forgotten here.
void PipelineStage::progress() {
  auto test = [&](int& h) {
    if (h >= 0 && pipe_.test(h)) h = -1;
  };
  for (auto& v : sends_)
    for (int& h : v) test(h);
  for (int& h : recv_in_) test(h);
  for (int& h : recv_grad_) test(h);
}

void PipelineStage::wait(int& h, const char* cat, const char* what, int m) {
  if (h < 0) return;
  const auto t0 = Tracer::Clock::now();
  pipe_.wait(h);
  h = -1;
  const auto t1 = Tracer::Clock::now();
  stats_.wait_s += std::chrono::duration<double>(t1 - t0).count();
  tracer_->span(cat, m >= 0 ? fmt::format("{} {}", what, m) : what, t0, t1, m);
}

double PipelineStage::run(const Backend& be, const Tensor& x, const int32_t* labels,
                          int64_t batch, const StepInfo& si, int64_t global_batch,
                          const std::function<void(int64_t)>& on_ready) {
  STRATA_CHECK(batch % micros_ == 0, "batch {} in {} micro-batches", batch, micros_);
  const size_t n = size_t(chunks_ * micros_);
  step_ = Step{&be, &x, labels, batch / micros_, &si, global_batch, &on_ready};
  mem_ = be.memory;
  slot_of_.assign(n, -1);
  recv_in_.assign(n, -1);
  recv_grad_.assign(n, -1);
  next_recv_ = 0;
  backwards_.assign(size_t(chunks_), 0);
  weights_.assign(size_t(chunks_), 0);
  post_next_recv();
  double loss = 0;
  for (const PipeOp& op : ops_) {
    if (op.kind == PipeOp::kForward) loss += forward(op.chunk, op.micro);
    else if (op.kind == PipeOp::kBackward) backward(op.chunk, op.micro);
    else weight_grads(op.chunk, op.micro);
    progress();
  }
  for (auto& v : sends_)
    for (int& h : v) wait(h, "send", "wait for sends", -1);
  return loss;
}

// Posts the receive of the next forward's input (one ahead: its data lands while this rank
// computes the current one).
void PipelineStage::post_next_recv() {
  auto needs_input = [&](const PipeOp& o) { return o.kind == PipeOp::kForward && !first(o.chunk); };
  while (size_t(next_recv_) < ops_.size() && !needs_input(ops_[size_t(next_recv_)])) ++next_recv_;
  if (size_t(next_recv_) < ops_.size()) {
    const PipeOp& o = ops_[size_t(next_recv_++)];
    post_input_recv(o.chunk, o.micro);
  }
}

// The span's name: the micro-batch, and its chunk when the stage has several.
std::string PipelineStage::span_name(const char* what, int c, int m) const {
  return chunks_ > 1 ? fmt::format("{} {}.{}", what, m, c) : fmt::format("{} {}", what, m);
}

double PipelineStage::forward(int c, int m) {
  const Backend& be = *step_.be;
  const int64_t bm = step_.bm;
  int slot;
  if (first(c)) {
    slot = alloc_slot(c);
    slot_of_[at(c, m)] = slot;
    const int64_t in_per_sample = numel(model_.stage_input_shape());
    in_[size_t(slot)] = Tensor::view(const_cast<float*>(step_.x->data()) + m * bm * in_per_sample,
                                     batched(bm, model_.stage_input_shape()), *step_.x->memory);
  } else {
    slot = slot_of_[at(c, m)];
    STRATA_CHECK(slot >= 0, "micro-batch {} (chunk {}) input not requested", m, c);
    wait(recv_in_[at(c, m)], "receive", "wait for activation", m);
    post_next_recv();
  }
  StepInfo sm = *step_.si;
  sm.first_sample = step_.si->first_sample + m * bm;
  sm.slot = slot;
  sm.chunk = c;
  const Tensor* out;
  double loss = 0;
  {
    Tracer::Scope span(*tracer_, "compute", span_name("forward", c, m), m);
    out = &model_.forward(be, in_[size_t(slot)], sm);
    if (last(c))  // a row of logits per sample, or per position for a language model
      loss = head_.loss_and_gradient(be, *out, step_.labels + m * bm * head_.rows_per_sample(),
                                     bm, step_.global_batch, dout_[size_t(slot)]);
  }
  slot_bytes_[size_t(slot)] = model_.activation_bytes(slot) + (first(c) ? 0 : in_[size_t(slot)].size() * 4);
  live_bytes_ += slot_bytes_[size_t(slot)];
  ++live_;
  stats_.peak_live = std::max(stats_.peak_live, live_);
  stats_.peak_act_bytes = std::max(stats_.peak_act_bytes, live_bytes_);
  stats_.max_slot_bytes = std::max(stats_.max_slot_bytes, slot_bytes_[size_t(slot)]);
  if (!last(c)) {
    // The next virtual stage: this chunk on the next rank, or the next chunk on rank 0.
    const int to_chunk = stage_ == stages_ - 1 ? c + 1 : c;
    Tensor& dy = dout_[size_t(slot)];
    dy.resize(batched(bm, model_.chunk_output_shape(c)), *be.memory);
    sends_[size_t(slot)].push_back(pipe_.start_send(out->data(), out->size(), next_, tag_of(to_chunk, m, micros_, false)));
    recv_grad_[at(c, m)] = pipe_.start_recv(dy.data(), dy.size(), next_, tag_of(c, m, micros_, true));
  }
  return loss;
}

// B: the whole backward, or (split) only the gradient at the chunk's input; sent down.
void PipelineStage::backward(int c, int m) {
  const int slot = slot_of_[at(c, m)];
  if (!last(c)) wait(recv_grad_[at(c, m)], "receive", "wait for gradient", m);
  const Tensor* dx;
  int& done = backwards_[size_t(c)];
  {
    Tracer::Scope span(*tracer_, "compute", span_name(split_ ? "backward B" : "backward", c, m), m);
    if (split_) {
      dx = model_.backward_input(*step_.be, dout_[size_t(slot)], slot, done > 0);
    } else {  // the chunk's last backward finishes its gradients: the allreduce may start
      dx = model_.backward(*step_.be, dout_[size_t(slot)], slot,
                           done == micros_ - 1 ? *step_.on_ready : nullptr, done > 0);
    }
  }
  ++done;
  if (!first(c)) {
    const int to_chunk = stage_ == 0 ? c - 1 : c;  // the virtual stage before
    sends_[size_t(slot)].push_back(pipe_.start_send(dx->data(), dx->size(), prev_, tag_of(to_chunk, m, micros_, true)));
  }
  if (!split_) retire(c, slot);
}

// W: the parameter gradients of a split backward; the slot is free after it.
void PipelineStage::weight_grads(int c, int m) {
  const int slot = slot_of_[at(c, m)];
  int& done = weights_[size_t(c)];
  {
    Tracer::Scope span(*tracer_, "compute", span_name("backward W", c, m), m);
    model_.backward_weight(*step_.be, slot, done == micros_ - 1 ? *step_.on_ready : nullptr, done > 0);
  }
  ++done;
  retire(c, slot);
}

void PipelineStage::retire(int c, int slot) {
  --live_;
  live_bytes_ -= slot_bytes_[size_t(slot)];
  release_slot(c, slot);
}

}  // namespace strata

namespace strata {

std::string partition_summary(const std::vector<LayerInfo>& layers,
                              const std::vector<double>& costs,
                              const std::vector<LayerRange>& ranges, int stages) {
  double total = 0;
  std::vector<double> cost(ranges.size(), 0.0);
  std::vector<int64_t> params(ranges.size(), 0);
  for (size_t s = 0; s < ranges.size(); ++s)
    for (int i = ranges[s].first; i < ranges[s].last; ++i) {
      cost[s] += costs[size_t(i)];
      params[s] += layers[size_t(i)].params;
    }
  for (double c : cost) total += c;
  std::string out;
  for (size_t s = 0; s < ranges.size(); ++s) {
    const auto& r = ranges[s];
    const std::string who = int(ranges.size()) > stages
                                ? fmt::format("stage {} chunk {}", int(s) % stages, int(s) / stages)
                                : fmt::format("stage {}", s);
    out += fmt::format("  {}: {}{} ({} layer{}, {} params, {:.0f}% of the cost)\n",
                       who, layers[size_t(r.first)].name,
                       r.last - r.first > 1 ? " .. " + layers[size_t(r.last) - 1].name : "",
                       r.last - r.first, r.last - r.first == 1 ? "" : "s", params[s],
                       100.0 * cost[s] / std::max(total, 1e-30));
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace strata

namespace strata {

PipelineFigures pipeline_figures(Comm& world, const ProcessGrid& grid, const PipelineStats& stats,
                                 std::vector<double> idle_shares, int micros, int chunks,
                                 const std::string& schedule) {
  const size_t P = size_t(grid.stages), s = size_t(grid.stage);
  ScheduleTheory t = schedule_theory(schedule, grid.stages, micros, chunks);
  PipelineFigures f{.peak_live = std::vector<double>(P, 0.0), .peak_mb = std::vector<double>(P, 0.0),
                    .micro_mb = std::vector<double>(P, 0.0), .idle = std::vector<double>(P, 0.0),
                    .theory_idle = std::move(t.idle),
                    .bound_live = std::vector<double>(t.live.begin(), t.live.end()),
                    .theory = t.bubble};
  f.peak_live[s] = stats.peak_live;
  f.peak_mb[s] = double(stats.peak_act_bytes) / 1e6;
  f.micro_mb[s] = double(stats.max_slot_bytes) / 1e6;
  world.allreduce_max(f.peak_live.data(), int64_t(P));
  world.allreduce_max(f.peak_mb.data(), int64_t(P));
  world.allreduce_max(f.micro_mb.data(), int64_t(P));
  if (!idle_shares.empty()) {
    auto mid = idle_shares.begin() + long(idle_shares.size() / 2);
    std::nth_element(idle_shares.begin(), mid, idle_shares.end());
    f.idle[s] = *mid / grid.replicas;
  }
  world.allreduce_sum(f.idle.data(), int64_t(P));
  return f;
}

std::string json_list(const std::vector<double>& v, int decimals) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{:.{}f}", i ? ", " : "", v[i], decimals);
  return out + "]";
}

}  // namespace strata

namespace strata {

std::pair<double, int64_t> PipelineStage::forward_only(const Backend& be, const Tensor& x,
                                                       const int32_t* labels, int64_t batch) {
  // Round the ranks once per chunk: chunk c of every stage, then chunk c + 1.
  const Tensor* out = nullptr;
  for (int c = 0; c < chunks_; ++c) {
    const Tensor* in = &x;
    if (!first(c)) {
      eval_in_.resize(batched(batch, model_.chunk_input_shape(c)), *be.memory);
      int h = pipe_.start_recv(eval_in_.data(), eval_in_.size(), prev_, kEvalTag + c);
      pipe_.wait(h);
      in = &eval_in_;
    }
    out = &model_.forward(be, *in, StepInfo{.training = false, .chunk = c});
    if (!last(c)) {
      int h = pipe_.start_send(out->data(), out->size(), next_, kEvalTag + (stage_ == stages_ - 1 ? c + 1 : c));
      pipe_.wait(h);
    }
  }
  if (!last(chunks_ - 1)) return {0.0, 0};
  return head_.loss_and_correct(be, *out, labels, batch);
}

}  // namespace strata
