#include "plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "data/data.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "strata/error.h"

namespace strata {
namespace {

bool is_block(const LayerInfo& l) { return l.describe.rfind("Block(", 0) == 0; }

// One layer's seconds for one micro-batch on one rank of the grid, before oversubscription.
struct LayerCost {
  double f = 0, b = 0, bi = 0, bw = 0, opt = 0;
};

class CostSource {
 public:
  CostSource(const MachineProfile& prof, const CommModel& comm, const GridChoice& g,
             std::vector<std::string>& notes)
      : prof_(prof), dev_(comm.device()), g_(g) {
    if (!prof.empty()) {
      notes.push_back(fmt::format("layers: measured {} ({} on {}, {} thread{}, {}, {})",
                                  prof.path.empty() ? "profile" : prof.path, prof.device,
                                  prof.cpu_model.empty() ? "?" : prof.cpu_model, prof.threads,
                                  prof.threads == 1 ? "" : "s", prof.precision, prof.date));
      if (prof.cpu_share < 0.9)
        notes.push_back(fmt::format("layers: measured while other work took the cores (the process ran "
                                    "{:.0f} % of the time): the figures include that contention",
                                    prof.cpu_share * 100));
      if (prof.precision != g.precision)
        notes.push_back(fmt::format("layers: the profile was measured in {}; {} assumed to cost the same",
                                    prof.precision, g.precision));
      if (prof.device == "cpu" && g.threads_per_rank != prof.threads)
        notes.push_back(fmt::format("layers: measured with {} thread(s), {} per rank assumed to scale "
                                    "in proportion", prof.threads, g.threads_per_rank));
    }
    if (dev_.present)
      flops_ = (g.precision == "bf16" ? dev_.peak_tflops_bf16 : dev_.peak_tflops_fp32) * 1e12 *
               dev_.achieved_fraction;
  }
  double loss_s(double b) const {
    if (prof_.empty()) return 0;  // projections: the loss is a small share of the head's cost
    return prof_.loss_s(b) * prof_.whole_ratio(b) *
           (prof_.device == "cpu" ? double(prof_.threads) / g_.threads_per_rank : 1.0);
  }
  // The step's copy of its batch (`batch` samples) into the device's memory: 0 on the host.
  double input_s(double batch) const { return prof_.empty() ? 0 : prof_.input_s(batch); }
  // Layers of the same kind (a GPT's blocks) cost the same: the median of their figures, so one
  // noisy measurement does not make one stage look dearer than the others.
  MicroBatchCost same_kind_median(const LayerProfile& p, double b) const {
    std::vector<MicroBatchCost> v;
    for (const LayerProfile& l : prof_.layers)
      if (l.kind == p.kind) v.push_back(MachineProfile::cost(l, b));
    auto med = [&](double MicroBatchCost::*f) {
      std::vector<double> x;
      for (const auto& c : v) x.push_back(c.*f);
      std::nth_element(x.begin(), x.begin() + long(x.size() / 2), x.end());
      return x[x.size() / 2];
    };
    return {med(&MicroBatchCost::forward_s), med(&MicroBatchCost::backward_s),
            med(&MicroBatchCost::backward_input_s), med(&MicroBatchCost::backward_weight_s)};
  }
  // Per micro-batch of b samples.
  LayerCost at(const LayerInfo& l, int index, double b) const {
    LayerCost c;
    if (const LayerProfile* p = prof_.empty() ? nullptr : prof_.find(index, l.describe)) {
      const MicroBatchCost m = same_kind_median(*p, b);
      const double scale = prof_.device == "cpu" ? double(prof_.threads) / g_.threads_per_rank : 1.0;
      // The layers as the whole pass runs them at this micro-batch (MachineProfile::whole).
      const double pass = scale * prof_.whole_ratio(b);
      c = {m.forward_s * pass, m.backward_s * pass, m.backward_input_s * pass,
           m.backward_weight_s * pass, p->optimizer_s * scale};
      // A layer measured without splitting (no parameters, or one that keeps state) does all
      // of backward in B.
      if (!p->splits) c.bi = c.b, c.bw = 0;
      return c;
    }
    if (flops_ <= 0)
      fail_input("{}: no figure for layer {} ({}) and no [device] to project it from: measure this "
                 "model with strata bench layers --config {}",
                 prof_.path.empty() ? "the machine profile" : prof_.path, index, l.describe,
                 prof_.config.empty() ? "CONFIG" : prof_.config);
    // Projection: forward's FLOPs at the assumed share of peak, backward twice that (half B, half
    // W); a layer without FLOPs (a view, an activation) as its output's bytes at memory speed.
    const double f = l.flops > 0 ? l.flops * b / flops_ : 0;
    c = {f, 2 * f, f, f, 0};
    // The optimizer reads and writes the parameter, its gradient and two moments (fp32): about
    // 28 bytes a parameter at a tenth of the flop rate in bytes/s (memory-bound).
    c.opt = double(l.params) * 28.0 / (flops_ / 10);
    if (!(l.params > 0)) c.bi = c.b, c.bw = 0;
    return c;
  }

 private:
  const MachineProfile& prof_;
  ClusterDevice dev_;
  const GridChoice& g_;
  double flops_ = 0;
};

// The whole stack's ranges for P stages of v chunks, as training partitions them.
std::vector<LayerRange> ranges_for(const RunConfig& cfg, const PlannedModel& m, const GridChoice& g,
                                   const CostSource& src, double b) {
  if (g.pipeline == 1 && g.virtual_stages == 1) return {LayerRange{0, int(m.layers.size())}};
  std::vector<double> costs = estimated_costs(m.layers);
  if (cfg.parallel.balance == "measured")
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const LayerCost c = src.at(m.layers[i], int(i), b);
      costs[i] = c.f + c.b;
    }
  const bool same_grid = cfg.parallel.pipeline_stages == g.pipeline &&
                         cfg.parallel.virtual_stages == g.virtual_stages;
  auto r = partition_layers(m.layers, costs, g.pipeline, same_grid ? cfg.parallel.stage_layers : std::vector<int>{},
                            g.virtual_stages);
  for (auto& x : r)
    if (x.last < 0) x.last = int(m.layers.size());
  return r;
}

struct StageWork {
  std::vector<OpCosts> chunks;
  double opt_s = 0;            // optimizer over the stage's parameters (this rank's share)
  double grad_bytes = 0;       // this rank's gradients (fp32)
  std::vector<std::vector<int64_t>> layer_tensors;  // per layer, in layer order: each tensor's floats here
  double last_backward_s = 0;  // the backward the gradient sums can overlap (the last micro-batch's)
  double tp_comm_s = 0;        // per step, tensor-parallel allreduces
  double boundary_bytes = 0;   // activations sent to the next stage, per micro-batch
  bool holds_table = false;
};

struct Context {
  const RunConfig& cfg;
  const PlannedModel& m;
  const GridChoice& g;
  const CommModel& comm;
  const CostSource& src;
  double b;         // micro-batch
  double slow;      // oversubscription and the busy node: the optimizer's and every op's
  double op_slow;   // the pipeline's ops' (the busy node's alone where the stages share cores)
};

double tp_allreduce_s(const Context& c, const LayerInfo& l) {
  // strata keeps activations in fp32 whatever train.precision (bf16 is the GEMMs' inputs).
  const double bytes = c.b * double(numel(l.out_shape)) * sizeof(float);
  return c.comm.collective_seconds(CommOp::allreduce, bytes, c.g.tensor, c.g.ranks_per_node);
}

StageWork stage_work(const Context& c, const std::vector<LayerRange>& ranges, int stage) {
  const GridChoice& g = c.g;
  const int P = g.pipeline, v = g.virtual_stages;
  StageWork w;
  for (int k = 0; k < v; ++k) {
    const LayerRange r = ranges[size_t(k * P + stage)];
    OpCosts oc;
    for (int i = r.first; i < r.last; ++i) {
      const LayerInfo& l = c.m.layers[size_t(i)];
      LayerCost lc = c.src.at(l, i, c.b);
      double split = 1, ar_f = 0, ar_b = 0;
      if (is_block(l) && g.tensor > 1) {
        split = g.tensor;
        ar_f = 2 * tp_allreduce_s(c, l), ar_b = 2 * tp_allreduce_s(c, l);
      }
      const double rec = g.recompute && is_block(l) ? lc.f / split * c.op_slow + ar_f : 0;
      oc.forward += lc.f / split * c.op_slow + ar_f;
      oc.backward += lc.b / split * c.op_slow + ar_b + rec;
      oc.backward_input += lc.bi / split * c.op_slow + ar_b + rec;
      oc.backward_weight += lc.bw / split * c.op_slow;
      w.tp_comm_s += (ar_f + ar_b + (rec > 0 ? ar_f : 0)) * g.micro_batches;
      w.opt_s += lc.opt / split * c.slow / (g.zero > 0 ? g.data : 1);
      w.grad_bytes += double(l.params) / split * sizeof(float);
      std::vector<int64_t>& t = w.layer_tensors.emplace_back(l.tensors);
      for (int64_t& n : t) n = (n + int64_t(split) - 1) / int64_t(split);  // a block's parts (its LayerNorms are whole: a few floats)
      if (l.describe.rfind("Embedding(", 0) == 0 || l.describe.rfind("LM head", 0) == 0) w.holds_table = true;
    }
    if (r.last == int(c.m.layers.size()))  // the loss and its gradient, with the last forward
      oc.forward += c.src.loss_s(c.b) * c.op_slow;
    if (r.first == 0)  // the step's batch from the loader (and its upload), before the first forward: a share each
      oc.forward += c.src.input_s(c.b * g.micro_batches) / g.micro_batches * c.op_slow;
    w.boundary_bytes = std::max(w.boundary_bytes, c.b * double(numel(c.m.layers[size_t(r.last - 1)].out_shape)) * 4);
    w.chunks.push_back(oc);
  }
  const bool split = splits_backward(g.schedule);
  for (const OpCosts& oc : w.chunks) w.last_backward_s += split ? oc.backward_weight : oc.backward;
  return w;
}

// Where the grid's groups sit (grid.h: tensor parts innermost, then replicas_in_node: a stage's
// replicas, or pipeline_in_node: a pipeline's stages): how many of each group share a node.
struct Placement {
  int tp_per_node = 1, dp_per_node = 1;
  bool pipe_intra = true;
};

Placement place(const RunConfig& cfg, const GridChoice& g) {
  const int r = std::max(1, g.ranks_per_node), T = g.tensor, D = g.data, P = g.pipeline;
  Placement p;
  p.tp_per_node = std::min(T, r);
  if (cfg.parallel.placement == "pipeline_in_node") {
    p.dp_per_node = std::max(1, std::min(D, r / std::max(1, T * P)));
    p.pipe_intra = T * P <= r;
  } else {
    p.dp_per_node = std::max(1, std::min(D, r / T));
    p.pipe_intra = D * T * P <= r;
  }
  return p;
}

// After a stage's last op: its data-parallel sums as data_parallel.cpp runs them, the
// optimizer, ZeRO's parameter all-gather and the token table's sum between the first and last
// stage. On the CPU, MPI's non-blocking collectives advance only inside MPI calls, on the
// training thread, which copies and sums the buckets itself: nothing of it hides behind
// backward. NCCL runs on its own stream: what the last micro-batch's backward covers is hidden,
// but the last bucket (the first layers' gradients) always waits.
struct After {
  double dp_s = 0, gather_s = 0, tied_s = 0, opt_s = 0;
  double total() const { return dp_s + gather_s + tied_s + opt_s; }
};

// The gradient buckets as GradientAllreducer cuts them (bucket_bounds over the flat buffer:
// the last layer's tensors first, each padded to flat_span): bytes each, in the order summed.
std::vector<double> gradient_buckets(const RunConfig& cfg, const StageWork& w) {
  std::vector<int64_t> ends;
  int64_t at = 0;
  for (auto l = w.layer_tensors.rbegin(); l != w.layer_tensors.rend(); ++l)
    for (int64_t n : *l) ends.push_back(at += flat_span(n));
  const std::vector<int64_t> b = bucket_bounds(ends, std::max<int64_t>(1, int64_t(cfg.dp.bucket_mb * 1048576.0 / 4)));
  std::vector<double> bytes;
  for (size_t i = 0; i + 1 < b.size(); ++i) bytes.push_back(double(b[i + 1] - b[i]) * sizeof(float));
  return bytes;
}

After after_stage(const RunConfig& cfg, const GridChoice& g, const CommModel& comm, const StageWork& w,
                  const Placement& pl, bool host, const PlannedModel& m) {
  After a;
  a.opt_s = w.opt_s;
  if (g.data > 1) {
    // One collective per bucket: each pays its latency and runs at its own size's bandwidth
    // (the MLP's 0.94 MB as 0.14 + 0.80 MB took 165 us where one 0.94 MB sum takes 135).
    const CommOp op = g.zero == 2 ? CommOp::reduce_scatter : CommOp::allreduce;
    double t = 0, last = 0;
    for (double bytes : gradient_buckets(cfg, w)) t += last = comm.collective_seconds(op, bytes, g.data, pl.dp_per_node);
    a.dp_s = host || !cfg.dp.overlap ? t : std::max(last, t - w.last_backward_s);
    if (g.zero > 0) a.gather_s = comm.collective_seconds(CommOp::all_gather, w.grad_bytes, g.data, pl.dp_per_node);
  }
  if (g.pipeline > 1 && w.holds_table && cfg.model.type == "gpt") {
    const LayerInfo& emb = m.layers.front();
    a.tied_s = comm.collective_seconds(CommOp::allreduce, double(emb.params) * sizeof(float), 2,
                                       pl.pipe_intra ? 2 : 1);
  }
  return a;
}

void check_grid(const RunConfig& cfg, const GridChoice& g) {
  const int64_t G = cfg.train.batch_size;
  if (g.data < 1 || g.pipeline < 1 || g.tensor < 1 || g.micro_batches < 1 || g.virtual_stages < 1)
    fail_input("grid D = {}, P = {}, T = {}, M = {}, v = {}: every factor must be at least 1", g.data,
               g.pipeline, g.tensor, g.micro_batches, g.virtual_stages);
  if (G % g.data != 0 || (G / g.data) % g.micro_batches != 0)
    fail_input("grid D = {}, M = {}: D x M must divide train.batch_size = {}", g.data, g.micro_batches, G);
}

std::string reason_for(const GridChoice& g, const StepTime& t, const CommModel& comm, int blocks) {
  std::vector<std::string> r;
  if (g.pipeline > 1)
    r.push_back(fmt::format("P = {} pays a {:.0f} % bubble{} ({}, M = {}{})", g.pipeline,
                            100 * t.bubble_s / std::max(t.total_s, 1e-12),
                            t.shared_cores ? " and shared cores" : "", g.schedule, g.micro_batches,
                            g.virtual_stages > 1 ? fmt::format(", v = {}", g.virtual_stages) : ""));
  if (g.tensor > 1) {
    const LinkFit f = comm.fit(CommOp::allreduce, g.tensor <= g.ranks_per_node ? CommLevel::kIntra : CommLevel::kInter);
    // Without a comm model the allreduces cost nothing: no bandwidth to name.
    r.push_back(fmt::format("T = {} pays 4 allreduces per block ({} blocks, {:.0f} % of the step){}", g.tensor,
                            blocks, 100 * t.tensor_comm_s / std::max(t.total_s, 1e-12),
                            f.busbw_Bps > 0 ? fmt::format(" over {:.1f} GB/s", f.busbw_Bps / 1e9) : ""));
  }
  if (g.data > 1)
    r.push_back(fmt::format("D = {} exposes {:.1f} ms of gradient sums{}", g.data, t.exposed_comm_s * 1e3,
                            g.zero ? fmt::format(" and ZeRO-{}'s all-gather", g.zero) : ""));
  if (g.recompute) r.push_back("recompute adds a block forward to each backward");
  if (t.shared_cores)
    r.push_back(fmt::format("{} threads per core: a stage idle in its bubble leaves the core to the others",
                            t.oversubscription));
  else if (t.oversubscription > 1)
    r.push_back(fmt::format("{} threads per core: compute {:.1f}x slower", t.oversubscription, t.oversubscription));
  if (t.busy_node > 1.005)
    r.push_back(fmt::format("{} ranks of a node at once: compute {:.2f}x slower", g.ranks_per_node, t.busy_node));
  if (r.empty()) r.push_back("one rank: compute only");
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? "; " : "") + r[i];
  return s;
}

StepTime predict_step_time_impl(const RunConfig& cfg, const PlannedModel& m, const GridChoice& g,
                                const MachineProfile& prof, const CommModel& comm) {
  check_grid(cfg, g);
  StepTime st;
  st.assumptions = comm.assumptions();
  const CostSource src(prof, comm, g, st.assumptions);
  st.micro_batch = double(cfg.train.batch_size) / g.data / g.micro_batches;
  if (!prof.whole.empty())
    st.assumptions.push_back(fmt::format("layers: scaled by {:.2f}, the whole pass over the sum of the layers "
                                         "timed one by one, at micro-batch {:g}",
                                         prof.whole_ratio(st.micro_batch), st.micro_batch));
  if (const double up = prof.input_s(st.micro_batch * g.micro_batches); up > 0)
    st.assumptions.push_back(fmt::format("input: the batch from the loader{} {:.3f} ms a step, before the "
                                         "first forward (measured)", prof.device == "cpu" ? "" : " and its copy to the device",
                                         up * 1e3));
  const bool host = prof.empty() ? false : prof.device == "cpu";
  if (host && prof.cores > 0) {
    st.oversubscription = std::max(1.0, double(g.ranks_per_node) * g.threads_per_rank / prof.cores);
    if (st.oversubscription > 1)
      st.assumptions.push_back(fmt::format("CPU: {} ranks x {} threads on {} cores: every rank's compute "
                                           "{:.2f}x slower", g.ranks_per_node, g.threads_per_rank,
                                           prof.cores, st.oversubscription));
    st.busy_node = prof.busy_factor(std::min(g.ranks_per_node, std::max(1, prof.cores / std::max(1, g.threads_per_rank))));
    if (prof.busy_ranks > 1)
      st.assumptions.push_back(fmt::format("CPU: {} ranks of a node computing at once: compute {:.2f}x slower "
                                           "(the whole pass on the profile's {} ranks at once: {:.2f}x alone)",
                                           g.ranks_per_node, st.busy_node, prof.busy_ranks, prof.busy_slowdown));
  }
  int blocks = 0;
  for (const LayerInfo& l : m.layers) blocks += is_block(l);
  const Placement pl = place(cfg, g);
  // More ranks than cores on a node holding the whole pipeline: its stages share the cores (a
  // stage in its bubble leaves its share to the others), simulated as such; else every op is
  // slowed alike.
  st.shared_cores = host && st.oversubscription > 1 && g.pipeline > 1 && pl.pipe_intra;
  const double slow = st.oversubscription * st.busy_node;
  const Context c{cfg, m, g, comm, src, st.micro_batch, slow, st.shared_cores ? st.busy_node : slow};
  const auto ranges = ranges_for(cfg, m, g, src, st.micro_batch);
  std::vector<StageWork> works;
  std::vector<std::vector<OpCosts>> costs;
  double boundary = 0;
  for (int s = 0; s < g.pipeline; ++s) {
    works.push_back(stage_work(c, ranges, s));
    costs.push_back(works.back().chunks);
    if (s + 1 < g.pipeline) boundary = std::max(boundary, works.back().boundary_bytes);
  }
  const double send_s = g.pipeline > 1 ? comm.collective_seconds(CommOp::sendrecv, boundary, 2, pl.pipe_intra ? 2 : 1) : 0;
  const bool plain = g.pipeline == 1 && g.micro_batches == 1;  // no pipeline engine: one whole backward
  const ScheduleSim sim = simulate_schedule(plain ? "1f1b" : g.schedule, g.pipeline, g.micro_batches,
                                            g.virtual_stages, costs, send_s,
                                            st.shared_cores ? g.pipeline / st.oversubscription : 0);
  STRATA_CHECK(!sim.idle.empty(), "schedule {} deadlocks at P = {}, M = {}", g.schedule, g.pipeline,
               g.micro_batches);
  int crit = 0;
  double end = -1;
  std::vector<After> after;
  for (int s = 0; s < g.pipeline; ++s) {
    after.push_back(after_stage(cfg, g, comm, works[size_t(s)], pl, host, m));
    const double e = sim.finish[size_t(s)] + after.back().total();
    if (e > end) end = e, crit = s;
  }
  const After& a = after[size_t(crit)];
  st.compute_s = sim.busy[size_t(crit)];
  st.bubble_s = sim.finish[size_t(crit)] - sim.busy[size_t(crit)];
  st.exposed_comm_s = a.dp_s + a.gather_s + a.tied_s;
  st.optimizer_s = a.opt_s;
  st.tensor_comm_s = works[size_t(crit)].tp_comm_s;
  // Every step ends with the ranks' agreement on the loss and stop signals (5 doubles).
  st.exposed_comm_s += comm.collective_seconds(CommOp::allreduce, 40, g.ranks(), g.ranks_per_node);
  if (cfg.checkpoint.every_steps > 0 && prof.checkpoint_write_Bps > 0) {
    // The whole state (parameters and optimizer moments, fp32) written every every_steps: an
    // asynchronous checkpoint stalls the step only for its snapshot (a memory copy).
    const double bytes = double(prof.checkpoint_bytes);
    const double rate = cfg.checkpoint.async && prof.memory_Bps > 0 ? prof.memory_Bps : prof.checkpoint_write_Bps;
    st.checkpoint_s = bytes / rate / double(cfg.checkpoint.every_steps);
  }
  st.total_s = st.compute_s + st.bubble_s + st.exposed_comm_s + st.optimizer_s + st.checkpoint_s;
  st.reason = reason_for(g, st, comm, blocks);
  return st;
}

}  // namespace

std::optional<DatasetInfo> planned_dataset(const RunConfig& cfg) {
  const bool preset_gpt = cfg.model.type == "gpt" && cfg.model.vocab > 0 &&
                          !std::filesystem::exists(cfg.data.path);
  if (preset_gpt) return std::nullopt;
  DatasetInfo info = open_dataset(cfg.data.path, {.format = cfg.data.format, .val_path = cfg.data.val_path,
                                                  .vocab = cfg.model.vocab});
  if (info.tokens) set_context(info, cfg.model.context);
  return info;
}

PlannedModel plan_model(const RunConfig& cfg) {
  PlannedModel m;
  if (const std::optional<DatasetInfo> info = planned_dataset(cfg)) {
    m.input = info->train.sample_shape;
    m.classes = info->classes;
  } else {
    m.input = {cfg.model.context};
    m.classes = cfg.model.vocab;
  }
  if (cfg.model.type == "gpt") m.tokens_per_sample = cfg.model.context;
  m.layers = describe_layers(cfg.model_spec(m.classes), m.input, m.classes);
  return m;
}

StepTime predict_step_time(const RunConfig& cfg, const PlannedModel& model, const GridChoice& g,
                           const MachineProfile& layers, const CommModel& comm) {
  return predict_step_time_impl(cfg, model, g, layers, comm);
}

StepTime predict_step_time(const RunConfig& cfg, const GridChoice& g, const MachineProfile& layers,
                           const CommModel& comm) {
  return predict_step_time(cfg, plan_model(cfg), g, layers, comm);
}

}  // namespace strata
