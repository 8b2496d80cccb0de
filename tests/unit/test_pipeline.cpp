// Pipeline partitioning and schedules (the parts that need no MPI; tests/mpi runs the rest).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "config/config.h"
#include "model/model.h"
#include "parallel/pipeline.h"
#include "strata/backend.h"
#include "strata/error.h"

using namespace strata;

namespace {
std::vector<LayerInfo> mlp_layers(std::vector<std::string> hidden) {
  ModelSpec spec = {"flatten"};
  for (auto& h : hidden) {
    spec.push_back("linear " + h);
    spec.push_back("relu");
  }
  spec.push_back("linear 10");
  return describe_layers(spec, {1, 28, 28}, 10);
}
}  // namespace

TEST_CASE("balanced partition: contiguous, every stage non-empty, costliest stage minimal", "[pipeline]") {
  auto layers = mlp_layers({"128", "128", "128", "128"});  // flatten, fc1..fc5 (relu fused)
  REQUIRE(layers.size() == 6);
  auto r = partition_layers(layers, estimated_costs(layers), 4, {});
  REQUIRE(r.size() == 4);
  CHECK(r.front().first == 0);
  CHECK(r.back().last == 6);
  for (size_t s = 0; s < r.size(); ++s) {
    CHECK(r[s].first < r[s].last);
    if (s) CHECK(r[s].first == r[s - 1].last);
  }
  // fc1 (784 -> 128) is over half the cost, so it must be alone with at most the flatten;
  // the cheap layers after it spread over the other three stages.
  CHECK(r[0].last == 2);  // flatten + fc1
  CHECK(r[1].last - r[1].first == 1);
  CHECK(r[2].last - r[2].first == 1);
}

TEST_CASE("balanced partition of equal layers is even", "[pipeline]") {
  auto layers = mlp_layers({"256", "256", "256", "256", "256", "256", "256"});
  auto r = partition_layers(layers, estimated_costs(layers), 2, {});
  const auto c = estimated_costs(layers);
  CHECK(c[1] == Approx(2.0 * layers[1].flops));  // fc1: no input gradient
  CHECK(c[2] == Approx(3.0 * layers[2].flops));
  std::vector<double> cost(2, 0);
  for (int s = 0; s < 2; ++s)
    for (int i = r[size_t(s)].first; i < r[size_t(s)].last; ++i) cost[size_t(s)] += c[size_t(i)];
  CHECK(std::max(cost[0], cost[1]) / (cost[0] + cost[1]) < 0.6);
}

TEST_CASE("explicit partition and its errors", "[pipeline]") {
  auto layers = mlp_layers({"128", "128"});  // 4 layers
  auto r = partition_layers(layers, estimated_costs(layers), 2, {1, 3});
  CHECK(r[0].first == 0);
  CHECK(r[0].last == 1);
  CHECK(r[1].last == 4);
  CHECK_THROWS_AS(partition_layers(layers, estimated_costs(layers), 2, {1, 2}), UserError);     // covers 3 of 4
  CHECK_THROWS_AS(partition_layers(layers, estimated_costs(layers), 2, {4}), UserError);        // wrong length
  CHECK_THROWS_AS(partition_layers(layers, estimated_costs(layers), 2, {0, 4}), UserError);     // empty stage
  CHECK_THROWS_AS(partition_layers(layers, estimated_costs(layers), 5, {}), UserError);         // more stages than layers
}

TEST_CASE("schedules: F before B before W, each once, sums in micro-batch order, live bound", "[pipeline]") {
  for (const std::string& kind : pipeline_schedules())
    for (int P : {1, 2, 4})
      for (int M = 1; M <= 8; ++M)
        for (int s = 0; s < P; ++s) {
          INFO(kind << " P=" << P << " M=" << M << " stage " << s);
          const auto ops = pipeline_schedule(kind, P, s, M);
          const bool split = splits_backward(kind);
          REQUIRE(ops.size() == size_t((split ? 3 : 2) * M));
          std::map<char, std::vector<int>> at;  // kind -> position of each micro-batch's op
          for (char k : {'F', 'B', 'W'}) at[k].assign(size_t(M), -1);
          std::map<char, int> next;
          int live = 0, peak = 0;
          for (size_t i = 0; i < ops.size(); ++i) {
            const PipeOp& o = ops[i];
            REQUIRE(o.micro >= 0);
            REQUIRE(o.micro < M);
            CHECK(at[o.kind][size_t(o.micro)] == -1);
            at[o.kind][size_t(o.micro)] = int(i);
            CHECK(o.micro == next[o.kind]++);  // each kind in micro-batch order
            if (o.kind == PipeOp::kForward) peak = std::max(peak, ++live);
            if (o.kind == (split ? PipeOp::kWeight : PipeOp::kBackward)) --live;
          }
          CHECK(live == 0);
          for (int m = 0; m < M; ++m) {
            CHECK(at['F'][size_t(m)] < at['B'][size_t(m)]);
            if (split) CHECK(at['B'][size_t(m)] < at['W'][size_t(m)]);
            else CHECK(at['W'][size_t(m)] == -1);
          }
          CHECK(peak == schedule_peak_live(ops));
          const int bound = kind == "gpipe" ? M : kind == "1f1b" || kind == "interleaved" ? std::min(P - s, M)
                          : kind == "zb-h1" ? std::min(P, M) : std::min(2 * P - 1, M);
          CHECK(peak == bound);
        }
}

// All stages together, each waiting for its neighbours' ops: no deadlock (every stage finishes
// its list), and the idle share of each schedule's theory: 1f1b and gpipe (P-1)/(M+P-1); zb-h1
// (P-1)/(3M+P-1) once M >= P (the optimum of a synchronous step with F, B and W costing the
// same: stage S starts S units late and has 3M units of work), zb-h2 once M >= 2P-2; neither
// above 1f1b.
TEST_CASE("schedules: no deadlock across stages, and each schedule's bubble", "[pipeline]") {
  for (const std::string& kind : pipeline_schedules())
    for (int P : {1, 2, 4})
      for (int M = 1; M <= 8; ++M) {
        INFO(kind << " P=" << P << " M=" << M);
        const auto idle = schedule_idle_shares(kind, P, M);
        REQUIRE(idle.size() == size_t(P));
        const double fb = double(P - 1) / (M + P - 1), zb = double(P - 1) / (3 * M + P - 1);
        for (double v : idle) {
          if (kind == "1f1b" || kind == "gpipe") CHECK(v == Approx(fb).margin(1e-12));
          if (kind == "zb-h1" && M >= P) CHECK(v == Approx(zb).margin(1e-12));
          if (kind == "zb-h2" && M >= 2 * P - 2) CHECK(v == Approx(zb).margin(1e-12));
          if (kind != "1f1b" && kind != "gpipe") {
            CHECK(v <= fb + 1e-12);
            CHECK(v >= zb - 1e-12);
          }
        }
      }
}

// Interleaved, v chunks: every (chunk, micro-batch) once forward and once backward, forward
// first; each chunk's micro-batches in order both ways; forwards take the chunks in turn P
// micro-batches at a time, backwards the other way round; v = 1 is 1f1b.
TEST_CASE("schedules: interleaved over P, M (multiples of P), v", "[pipeline]") {
  for (int P : {1, 2, 4})
    for (int M = P; M <= 8; M += P)
      for (int v : {1, 2})
        for (int s = 0; s < P; ++s) {
          INFO("P=" << P << " M=" << M << " v=" << v << " stage " << s);
          const auto ops = pipeline_schedule("interleaved", P, s, M, v);
          REQUIRE(ops.size() == size_t(2 * M * v));
          if (v == 1) {
            const auto f1b1 = pipeline_schedule("1f1b", P, s, M);
            for (size_t i = 0; i < ops.size(); ++i)
              CHECK((ops[i].kind == f1b1[i].kind && ops[i].micro == f1b1[i].micro && ops[i].chunk == 0));
          }
          std::map<std::pair<int, int>, int> fwd, bwd;
          std::vector<int> next_f(size_t(v), 0), next_b(size_t(v), 0);
          int live = 0, peak = 0;
          for (size_t i = 0; i < ops.size(); ++i) {
            const PipeOp& o = ops[i];
            REQUIRE((o.chunk >= 0 && o.chunk < v && o.micro >= 0 && o.micro < M));
            REQUIRE(o.kind != PipeOp::kWeight);
            auto& at = o.kind == PipeOp::kForward ? fwd : bwd;
            CHECK(at.count({o.chunk, o.micro}) == 0);
            at[{o.chunk, o.micro}] = int(i);
            auto& next = o.kind == PipeOp::kForward ? next_f : next_b;
            CHECK(o.micro == next[size_t(o.chunk)]++);
            live += o.kind == PipeOp::kForward ? 1 : -1;
            peak = std::max(peak, live);
          }
          for (auto& [key, i] : fwd) CHECK(i < bwd.at(key));
          CHECK(peak == schedule_peak_live(ops));
          CHECK(peak == (v == 1 ? std::min(P - s, M) : std::min(2 * (P - s - 1) + (v - 1) * P + 1, M * v)));
        }
}

// Interleaved across stages: no deadlock, and the bubble of Megatron-LM's analysis,
// (P-1)/(vM+P-1), on every stage.
TEST_CASE("schedules: interleaved has no deadlock and its bubble is (P-1)/(vM+P-1)", "[pipeline]") {
  for (int P : {1, 2, 4})
    for (int M = P; M <= 8; M += P)
      for (int v : {1, 2}) {
        INFO("P=" << P << " M=" << M << " v=" << v);
        const auto idle = schedule_idle_shares("interleaved", P, M, v);
        REQUIRE(idle.size() == size_t(P));
        for (double x : idle) CHECK(x == Approx(double(P - 1) / (v * M + P - 1)).margin(1e-12));
      }
}

TEST_CASE("micro-batch count: auto picks the largest divisor up to 4P, a given one must divide", "[pipeline]") {
  CHECK(resolve_microbatches(0, 1, 64, 1) == 1);
  CHECK(resolve_microbatches(0, 2, 64, 1) == 8);
  CHECK(resolve_microbatches(0, 4, 64, 2) == 16);  // per replica 32, 4P = 16
  CHECK(resolve_microbatches(0, 4, 36, 1) == 12);  // 16, 15, 14, 13 do not divide 36
  CHECK(resolve_microbatches(0, 2, 14, 1) == 7);
  CHECK(resolve_microbatches(4, 2, 64, 2) == 4);
  CHECK_THROWS_AS(resolve_microbatches(3, 2, 64, 2), UserError);
  // Interleaved: a multiple of P.
  CHECK(resolve_microbatches(0, 4, 36, 1, true) == 12);
  CHECK(resolve_microbatches(0, 3, 48, 1, true) == 12);  // 12 divides 48: the largest multiple of 3 up to 12
  CHECK(resolve_microbatches(0, 4, 40, 1, true) == 8);   // 16, 12 do not divide 40
  CHECK_THROWS_AS(resolve_microbatches(0, 4, 6, 1, true), UserError);
  CHECK_THROWS_AS(resolve_microbatches(6, 4, 48, 1, true), UserError);
  CHECK(resolve_microbatches(8, 4, 48, 1, true) == 8);
}

TEST_CASE("measured costs: one positive time per layer, larger for a wider layer", "[pipeline]") {
  ModelSpec spec = {"flatten", "linear 256", "relu", "linear 1024", "relu", "linear 10"};
  auto layers = describe_layers(spec, {1, 28, 28}, 10);
  // One math thread: with OpenMP's default (every core) a GEMM on a busy machine (ctest runs
  // tests side by side) can wait a scheduler quantum for its second thread, ~20 ms for any
  // layer, which measures the machine rather than the layer.
  std::string why;
  const Backend& be = select_backend({.device = "cpu", .threads = 1}, &why);
  auto c = measured_costs(spec, {1, 28, 28}, 10, be, 32, 5);
  REQUIRE(c.size() == layers.size());
  for (double v : c) CHECK(v >= 0);
  CHECK(c[2] > c[3]);  // fc2 (256 -> 1024) against fc3 (1024 -> 10): 25x the FLOPs
  auto r = partition_layers(layers, c, 2, {});
  CHECK(r[0].first == 0);
  CHECK(r[1].last == int(layers.size()));
}
