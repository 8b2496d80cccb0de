// The planner's search (plan/grid_search.h) without a machine: every grid it offers passes
// train's own checks, ZeRO and recompute lower the memory they should, and the no-fit message
// names the smallest grid.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "plan/grid_search.h"
#include "run/run_plan.h"
#include "strata/error.h"

using namespace strata;

namespace {

// A small GPT whose shape comes from the config alone (no data file).
RunConfig small_gpt() {
  RunConfig c;
  c.data.path = "/nonexistent/tokens.h5";
  c.model.type = "gpt";
  c.model.layers = {"4"};
  c.model.heads = 4;
  c.model.dim = 32;
  c.model.context = 16;
  c.model.vocab = 64;
  c.train.batch_size = 16;
  c.train.optimizer = "adamw";
  return c;
}

PlanRequest four_ranks(double bytes) {
  PlanRequest r;
  r.nodes = 1;
  r.ranks_per_node = 4;
  r.memory = {bytes, "test"};
  return r;
}

const Candidate* find(const PlanResult& r, const GridChoice& g) {
  for (const Candidate& c : r.candidates)
    if (c.grid.data == g.data && c.grid.pipeline == g.pipeline && c.grid.tensor == g.tensor &&
        c.grid.zero == g.zero && c.grid.schedule == g.schedule && c.grid.micro_batches == g.micro_batches &&
        c.grid.virtual_stages == g.virtual_stages && c.grid.recompute == g.recompute)
      return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("every grid plan offers passes train's checks", "[plan]") {
  const RunConfig cfg = small_gpt();
  const PlanModel m = describe_plan_model(cfg);
  const PlanResult r = search_grids(cfg, m, four_ranks(1e12), MachineProfile{}, CommModel{});
  REQUIRE(r.candidates.size() > 50);
  bool tensor = false, pipeline = false, interleaved = false;
  for (const Candidate& c : r.candidates) {
    const RunConfig g = with_grid(cfg, c.grid);
    REQUIRE_NOTHROW(validate(g));
    REQUIRE(grid_shape(g, 4).D == c.grid.data);
    REQUIRE(c.grid.ranks() == 4);
    REQUIRE(c.fits);
    tensor |= c.grid.tensor > 1;
    pipeline |= c.grid.pipeline > 1;
    interleaved |= c.grid.schedule == "interleaved";
  }
  REQUIRE((tensor && pipeline && interleaved));
  // Untimed: the plain data-parallel grid first.
  REQUIRE(r.candidates.front().grid.data == 4);
  REQUIRE(r.candidates.front().grid.zero == 0);
}

TEST_CASE("grids train refuses are left out and counted", "[plan]") {
  RunConfig cfg = small_gpt();
  cfg.model.heads = 2;  // T = 4 does not divide the heads: validate() refuses it
  const PlanResult r = search_grids(cfg, describe_plan_model(cfg), four_ranks(1e12), MachineProfile{}, CommModel{});
  REQUIRE(r.refused > 0);
  for (const Candidate& c : r.candidates) REQUIRE(c.grid.tensor <= 2);
}

TEST_CASE("ZeRO and recompute lower the memory they should", "[plan]") {
  const RunConfig cfg = small_gpt();
  const PlanResult r = search_grids(cfg, describe_plan_model(cfg), four_ranks(1e12), MachineProfile{}, CommModel{});
  GridChoice g{.data = 4, .micro_batches = 1};
  const Candidate* plain = find(r, g);
  g.zero = 1;
  const Candidate* zero1 = find(r, g);
  g.zero = 0;
  g.recompute = true;
  const Candidate* recompute = find(r, g);
  REQUIRE((plain && zero1 && recompute));
  const MemoryEstimate &p = plain->memory.planned.estimate, &z = zero1->memory.planned.estimate;
  REQUIRE(z.optimizer == Approx(p.optimizer / 4));
  REQUIRE(z.parameters == p.parameters);
  REQUIRE(recompute->memory.planned.estimate.activations < p.activations);
}

TEST_CASE("a limit no grid fits names the smallest grid", "[plan]") {
  const RunConfig cfg = small_gpt();
  const PlanResult r = search_grids(cfg, describe_plan_model(cfg), four_ranks(1e6), MachineProfile{}, CommModel{});
  REQUIRE(r.best() == nullptr);
  double least = 1e300;
  for (const Candidate& c : r.candidates) least = std::min(least, c.memory.peak);
  const std::string msg = no_fit_message(r, four_ranks(1e6), "x.toml");
  REQUIRE_THAT(msg, Catch::Matchers::StartsWith("x.toml: no grid of 4 ranks fits 1 MB per rank (test): the smallest needs"));
  REQUIRE_THAT(msg, Catch::Matchers::Contains(fmt::format("{:.0f} MB", least / 1e6)));
  REQUIRE_THAT(msg, Catch::Matchers::EndsWith("give more ranks or memory"));
}

TEST_CASE("memory checkpoints count against the rank's memory: two generations of its part, and "
          "of its partner's unless replicas on other nodes hold it", "[plan]") {
  RunConfig cfg = small_gpt();
  cfg.checkpoint.memory_every = 1;
  const PlanModel m = describe_plan_model(cfg);
  PlanRequest two_nodes = four_ranks(1e12);
  two_nodes.nodes = 2, two_nodes.ranks_per_node = 2;
  // The memory-checkpoint bytes of grid g on `req`, against its part (parameters, optimizer).
  auto copies = [&](const PlanRequest& req, GridChoice g, const std::string& placement = "") {
    RunConfig c = cfg;
    if (!placement.empty()) c.parallel.placement = placement;
    const PlanResult r = search_grids(c, m, req, MachineProfile{}, CommModel{});
    g.ranks_per_node = req.ranks_per_node;
    const Candidate* x = find(r, g);
    REQUIRE(x != nullptr);
    const MemoryEstimate& e = x->memory.planned.estimate;
    CHECK(x->memory.peak == Approx(e.total() + x->memory.memory_checkpoints));  // the CPU's
    return x->memory.memory_checkpoints / (e.parameters + e.optimizer);
  };
  // D = 4 over 2 nodes: the replicas hold each part on both nodes, no partner copies.
  CHECK(copies(two_nodes, {.data = 4}) == Approx(2));
  // ZeRO-1: shards of their own, each also kept by a partner.
  CHECK(copies(two_nodes, {.data = 4, .zero = 1}) == Approx(4));
  // P = 2 x D = 2: a stage's replicas are neighbours on one node by default; with the pipeline
  // in the node, on both nodes.
  CHECK(copies(two_nodes, {.data = 2, .pipeline = 2}) == Approx(4));
  CHECK(copies(two_nodes, {.data = 2, .pipeline = 2}, "pipeline_in_node") == Approx(2));
  // One node: no partner to copy to.
  CHECK(copies(four_ranks(1e12), {.data = 1, .pipeline = 4}) == Approx(2));
  // A GPU's device memory does not hold them.
  PlanRequest gpu = two_nodes;
  gpu.gpu = true;
  const PlanResult r = search_grids(cfg, m, gpu, MachineProfile{}, CommModel{});
  REQUIRE(!r.candidates.empty());
  const Candidate& c = r.candidates.front();
  CHECK(c.memory.memory_checkpoints > 0);
  CHECK(c.memory.peak == Approx(c.memory.planned.estimate.total()));
  cfg.checkpoint.memory_every = 0;
  CHECK(copies(two_nodes, {.data = 4}) == Approx(0));
}
