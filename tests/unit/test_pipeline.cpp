// Pipeline partitioning and schedules (the parts that need no MPI; tests/mpi runs the rest).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "strata/backend.h"
#include "strata/error.h"
#include "strata/model.h"
#include "strata/pipeline.h"

using namespace strata;

namespace {
std::vector<LayerInfo> mlp_layers(std::vector<std::string> hidden) {
  ModelSpec spec = {"flatten"};
  for (auto& h : hidden) {
    spec.push_back("linear " + h);
    spec.push_back("relu");
  }
  spec.push_back("linear 10");
  return Model::describe_layers(spec, {1, 28, 28}, 10);
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

TEST_CASE("schedules: every micro-batch once forward, once backward, forward first", "[pipeline]") {
  for (std::string kind : {"gpipe", "1f1b"})
    for (int P : {1, 2, 4})
      for (int M : {1, 2, 3, 8})
        for (int s = 0; s < P; ++s) {
          INFO(kind << " P=" << P << " M=" << M << " stage " << s);
          auto ops = pipeline_schedule(kind, P, s, M);
          REQUIRE(ops.size() == size_t(2 * M));
          std::vector<int> fwd_at(size_t(M), -1), bwd_at(size_t(M), -1);
          int live = 0, peak = 0, next_b = 0;
          for (size_t i = 0; i < ops.size(); ++i) {
            auto& at = ops[i].forward ? fwd_at : bwd_at;
            CHECK(at[size_t(ops[i].micro)] == -1);
            at[size_t(ops[i].micro)] = int(i);
            live += ops[i].forward ? 1 : -1;
            peak = std::max(peak, live);
            if (!ops[i].forward) CHECK(ops[i].micro == next_b++);  // gradients summed in order
          }
          for (int m = 0; m < M; ++m) CHECK(fwd_at[size_t(m)] < bwd_at[size_t(m)]);
          if (kind == "gpipe") CHECK(peak == M);
          else CHECK(peak == std::min(P - s, M));
        }
}

TEST_CASE("micro-batch count: auto picks the largest divisor up to 4P; a given one must divide", "[pipeline]") {
  CHECK(resolve_microbatches(0, 1, 64, 1) == 1);
  CHECK(resolve_microbatches(0, 2, 64, 1) == 8);
  CHECK(resolve_microbatches(0, 4, 64, 2) == 16);  // per replica 32, 4P = 16
  CHECK(resolve_microbatches(0, 4, 36, 1) == 12);  // 16, 15, 14, 13 do not divide 36
  CHECK(resolve_microbatches(0, 2, 14, 1) == 7);
  CHECK(resolve_microbatches(4, 2, 64, 2) == 4);
  CHECK_THROWS_AS(resolve_microbatches(3, 2, 64, 2), UserError);
}

TEST_CASE("measured costs: one positive time per layer, larger for a wider layer", "[pipeline]") {
  ModelSpec spec = {"flatten", "linear 256", "relu", "linear 1024", "relu", "linear 10"};
  auto layers = Model::describe_layers(spec, {1, 28, 28}, 10);
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
