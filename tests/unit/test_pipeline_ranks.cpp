// Pipeline schedules on in-process ranks: P stages x D replicas, built as the trainer builds
// them (make_grid, partition_layers, a Model per stage, PipelineStage, GradientAllreducer),
// against one rank that runs the whole model on the same micro-batches with plain gradient
// accumulation. Each micro-batch's arithmetic is the same whichever rank does it and the
// gradients are summed in micro-batch order (then over replicas in rank order), so parameter
// gradients, losses and evaluation must agree BITWISE, over two steps with an update between.
#include <catch2/catch.hpp>

#include <map>

#include "config/config.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "ranks_util.h"
#include "strata/backend.h"
#include "strata/rng.h"

using namespace strata;
using namespace strata::test;

namespace {

constexpr int kSteps = 2;
constexpr int64_t kMicroBatch = 3;  // samples per micro-batch
constexpr float kLr = 0.05f;
constexpr uint64_t kSeed = 11;

struct Net {
  const char* name;
  ModelSpec spec;  // at least 4 layers after fusion, for 4 stages
  Shape input;
  int classes;
};
const Net kNets[] = {
    // flatten, linear+relu, dropout (keyed on sample positions), linear+relu, linear
    {"mlp", {"flatten", "linear 24", "relu", "dropout 0.25", "linear 16", "relu", "linear 10"}, {2, 3, 5}, 10},
    {"deep mlp", {"flatten", "linear 12", "relu", "linear 12", "relu", "linear 12", "relu",
                  "linear 12", "relu", "linear 12", "relu", "linear 12", "relu", "linear 6"}, {1, 4, 4}, 6},
};

// The global batch of one step: G samples and labels; replica r takes samples [r G/D, (r+1) G/D).
struct Batch {
  int64_t G;
  Tensor x;
  std::vector<int32_t> y;
};
Batch make_batch(const Net& net, int64_t G, int step) {
  Batch b{G, Tensor(batched(G, net.input)), {}};
  Rng rng(100 + uint64_t(step));
  for (int64_t i = 0; i < b.x.size(); ++i) b.x[i] = rng.uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < G; ++i) b.y.push_back(int32_t((i * 7 + step) % net.classes));
  return b;
}
// Replica r's share of the samples (a view) and of the labels.
Tensor share(const Batch& b, const Net& net, int r, int D) {
  const int64_t n = b.G / D;
  return Tensor::view(const_cast<float*>(b.x.data()) + r * n * numel(net.input), batched(n, net.input));
}

const Backend& cpu_one_thread() {
  // One math thread, set for the calling thread (OpenMP's count is per thread).
  std::string why;
  return select_backend({.device = "cpu", .threads = 1}, &why);
}

using Grads = std::map<std::string, std::vector<float>>;

Grads grads_of(const Model& m) {
  Grads g;
  for (const Param* p : m.params()) g[p->name].assign(p->grad, p->grad + numel(p->shape));
  return g;
}

void sgd(Model& m) {
  for (int64_t i = 0; i < m.num_params(); ++i) m.values()[i] -= kLr * m.grads()[i];
}

// What the reference, or one rank of the pipeline, saw.
struct Outcome {
  int stage = 0, replica = 0;
  std::vector<Grads> grads;  // per step: the replica sum, this rank's parameters
  std::vector<double> loss;  // per step: this replica's sum of per-sample losses (last stage)
  std::pair<double, int64_t> eval{0, 0};  // forward_only on the last step's share (last stage)
};

// The reference: per replica, the whole model over its M micro-batches with plain gradient
// accumulation (forward, loss head, backward, written out here, not through PipelineStage);
// then the replicas' gradients summed in rank order; one update per step.
std::vector<Outcome> reference(const Net& net, int D, int M) {
  const Backend& be = cpu_one_thread();
  const int64_t G = int64_t(D) * M * kMicroBatch;
  Model m(net.spec, net.input, net.classes);
  m.init(kSeed);
  m.place(be);
  std::vector<Outcome> out(static_cast<size_t>(D));
  Tensor probs, dlogits;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = make_batch(net, G, step);
    std::vector<float> sum;
    for (int r = 0; r < D; ++r) {
      double loss = 0;
      for (int mb = 0; mb < M; ++mb) {
        const int64_t first = r * (G / D) + mb * kMicroBatch;
        const Tensor x = Tensor::view(const_cast<float*>(b.x.data()) + first * numel(net.input),
                                      batched(kMicroBatch, net.input));
        const StepInfo si{.training = true, .seed = kSeed, .step = uint64_t(step), .first_sample = first};
        const Tensor& logits = m.forward(be, x, si);
        probs.resize(logits.shape);
        dlogits.resize(logits.shape);
        const int32_t* y = b.y.data() + first;
        loss += be.softmax_xent_forward(probs.data(), logits.data(), y, int(kMicroBatch), net.classes);
        be.softmax_xent_backward(dlogits.data(), probs.data(), y, int(kMicroBatch), net.classes, 1.0f / float(G));
        m.backward(be, dlogits, /*slot=*/0, {}, /*accumulate=*/mb > 0);
      }
      out[size_t(r)].loss.push_back(loss);
      if (r == 0) sum.assign(m.grads().data(), m.grads().data() + m.num_params());
      else for (int64_t i = 0; i < m.num_params(); ++i) sum[size_t(i)] += m.grads()[i];
    }
    std::copy(sum.begin(), sum.end(), m.grads().data());
    for (auto& o : out) o.grads.push_back(grads_of(m));
    if (step == kSteps - 1)
      for (int r = 0; r < D; ++r) {  // evaluation before the last update, as the pipeline's
        const Tensor& logits = m.forward(be, share(b, net, r, D), StepInfo{.training = false});
        probs.resize(logits.shape);
        const int32_t* y = b.y.data() + r * (G / D);
        const int rows = int(G / D);
        out[size_t(r)].eval = {be.softmax_xent_forward(probs.data(), logits.data(), y, rows, net.classes),
                               be.count_correct(logits.data(), y, rows, net.classes)};
      }
    sgd(m);
  }
  return out;
}

// One rank of a P x D grid (replicas_in_node placement), as the trainer runs a step; v chunks
// per stage for the interleaved schedule.
Outcome pipeline_rank(Comm& world, const Net& net, int P, int M, const std::string& schedule, int v = 1) {
  const Backend& be = cpu_one_thread();
  ProcessGrid grid = make_grid(world, P, 1, "replicas_in_node", 1);
  const int D = grid.replicas;
  const int64_t G = int64_t(D) * M * kMicroBatch;
  const auto layers = describe_layers(net.spec, net.input, net.classes);
  const auto ranges = partition_layers(layers, estimated_costs(layers), P * v, {});
  Model m(net.spec, net.input, net.classes, stage_chunks(ranges, P, grid.stage));
  m.init(kSeed);
  m.place(be);
  GradientAllreducer reducer(*grid.stage_comm, m, m.grads(), 64.0, /*overlap=*/true);
  Tracer tracer;
  PipelineStage stage(m, *grid.pipe_comm, P, M, schedule, tracer);
  Outcome o{.stage = grid.stage, .replica = grid.replica};
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = make_batch(net, G, step);
    const StepInfo si{.training = true, .seed = kSeed, .step = uint64_t(step),
                      .first_sample = grid.replica * (G / D)};
    const double loss = stage.run(be, share(b, net, grid.replica, D), b.y.data() + grid.replica * (G / D),
                                  G / D, si, G, [&](int64_t ready) { reducer.on_grads_ready(ready); });
    reducer.finish();
    o.grads.push_back(grads_of(m));
    if (grid.last_stage()) o.loss.push_back(loss);
    if (step == kSteps - 1)
      o.eval = stage.forward_only(be, share(b, net, grid.replica, D), b.y.data() + grid.replica * (G / D), G / D);
    sgd(m);
  }
  return o;
}

// Every rank's gradients equal the reference's, bit for bit; every parameter is on some stage
// of each replica; the last stages' losses and evaluation equal their replica's.
void check_against(const std::vector<Outcome>& ranks, const std::vector<Outcome>& ref, int P) {
  for (const Outcome& o : ranks) {
    INFO("stage " << o.stage << ", replica " << o.replica);
    const Outcome& want = ref[size_t(o.replica)];
    REQUIRE(o.grads.size() == size_t(kSteps));
    REQUIRE(o.loss.size() == (o.stage == P - 1 ? size_t(kSteps) : 0u));
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step);
      for (const auto& [name, g] : o.grads[size_t(step)]) {
        INFO(name);
        CHECK(same_bits(g, want.grads[size_t(step)].at(name)));
      }
      if (o.stage == P - 1) CHECK(o.loss[size_t(step)] == want.loss[size_t(step)]);
    }
    if (o.stage == P - 1) CHECK(o.eval == want.eval);
  }
  for (size_t r = 0; r < ref.size(); ++r) {
    Grads all;
    for (const Outcome& o : ranks)
      if (o.replica == int(r)) all.insert(o.grads[0].begin(), o.grads[0].end());
    CHECK(all.size() == ref[r].grads[0].size());
  }
}

}  // namespace

TEST_CASE("pipeline stages x replicas give the one-rank gradients, losses and evaluation bitwise", "[ranks][pipeline]") {
  for (const Net& net : kNets)
    for (int D : {1, 2})
      for (int M : {1, 2, 3, 4, 5}) {
        const auto ref = reference(net, D, M);
        for (int P : {2, 3, 4}) {
          if (M != 1 && M != 2 && M != 4 && M != P + 1) continue;
          for (const std::string& schedule : pipeline_schedules()) {
            // Interleaved: 2 chunks per stage, M a multiple of P, a layer per chunk at least.
            const int v = schedule == "interleaved" ? 2 : 1;
            const int L = int(describe_layers(net.spec, net.input, net.classes).size());
            if (v > 1 && (M % P != 0 || P * v > L)) continue;
            INFO(net.name << ": P " << P << " x D " << D << ", " << M << " micro-batches, " << schedule);
            auto ranks = on_ranks(P * D, [&](Comm& c) { return pipeline_rank(c, net, P, M, schedule, v); });
            check_against(ranks, ref, P);
          }
        }
      }
}
