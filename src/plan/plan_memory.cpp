#include "plan/plan_memory.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/parse.h"
#include "checkpoint/memory_checkpoints.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "strata/error.h"

namespace strata {

PlanModel describe_plan_model(const RunConfig& cfg) {
  PlanModel m;
  m.model = plan_model(cfg);  // the step-time model's reading of the data's shape
  std::error_code ec;
  m.source = std::filesystem::exists(cfg.data.path, ec) || cfg.model.type != "gpt"
                 ? cfg.data.path
                 : fmt::format("the config (data.path {} not found: context {}, vocabulary {})",
                               cfg.data.path, cfg.model.context, cfg.model.vocab);
  // What the memory estimate reads of the dataset: the logits' width and whether it is text.
  m.info.tokens = cfg.model.type == "gpt";
  m.info.classes = m.model.classes;
  m.info.train.sample_shape = m.model.input;
  m.has_blocks = std::any_of(m.model.layers.begin(), m.model.layers.end(),
                             [](const LayerInfo& l) { return l.internal_bytes > 0; });
  m.rows_per_sample = numel(m.model.layers.back().out_shape) / std::max(1, m.model.classes);
  return m;
}

namespace {
// Bytes from "2e9", "80GB" / "512MB" (powers of 1000) or "80G" / "80GiB" (powers of 1024).
std::optional<double> parse_bytes_with_unit(const std::string& text, std::string* why) {
  static const std::pair<const char*, double> units[] = {
      {"TiB", 0x1p40}, {"GiB", 0x1p30}, {"MiB", 0x1p20}, {"KiB", 0x1p10}, {"TB", 1e12}, {"GB", 1e9},
      {"MB", 1e6},     {"KB", 1e3},     {"T", 0x1p40},   {"G", 0x1p30},   {"M", 0x1p20}, {"K", 0x1p10}};
  for (const auto& [unit, scale] : units)
    if (text.size() > std::strlen(unit) && text.ends_with(unit)) {
      const auto v = parse_real(text.substr(0, text.size() - std::strlen(unit)), why);
      return v ? std::optional<double>(*v * scale) : std::nullopt;
    }
  return parse_real(text, why);
}
}  // namespace

RankMemory rank_memory(const std::string& given, int ranks_per_node, const std::string& flag) {
  if (given.empty() || given == "auto") {
    const MemoryBound node = node_memory_limit();
    return {double(node.bytes) / ranks_per_node,
            ranks_per_node == 1 ? node.source
                                : fmt::format("{} / {} ranks per node", node.source, ranks_per_node)};
  }
  std::string why;
  const std::optional<double> bytes = parse_bytes_with_unit(given, &why);
  if (!bytes || !(*bytes >= 1 && *bytes <= 1e18))
    fail_input("{} {}: must be a byte count from 1 to 1e18 (2e9, 80GB, 64GiB) or auto{}", flag, given,
               why.empty() ? "" : " (" + why + ")");
  return {*bytes, fmt::format("{} {}", flag, given)};
}

RunPlan candidate_plan(const RunConfig& cfg, const PlanModel& m, int ranks) {
  RunPlan p;
  p.ranks = ranks;
  p.P = cfg.parallel.pipeline_stages;
  p.T = cfg.parallel.tensor;
  const GridShape g = grid_shape(cfg, ranks);
  p.D = g.D;
  p.M = g.M;
  p.info = m.info;
  p.layers = m.model.layers;
  p.costs = estimated_costs(p.layers);
  p.v = cfg.parallel.virtual_stages;
  p.ranges = partition_layers(p.layers, p.costs, p.P, cfg.parallel.stage_layers, p.v);
  p.rows_per_sample = m.rows_per_sample;
  return p;
}

namespace {

// Whether every part has data-parallel replicas on two nodes or more, whose own memory copies
// are then each other's second copy (no partner copies): the runtime's parts_span_nodes() over
// the grid's ranks, keyed as the session keys them, on nodes filled as Slurm fills them.
bool replicas_span_nodes(const RunConfig& cfg, const RunPlan& plan, int ranks_per_node) {
  ProcessGrid g;  // world_rank() of this placement
  g.stages = plan.P, g.replicas = plan.D, g.tensors = plan.T, g.placement = cfg.parallel.placement;
  std::vector<int64_t> same_as(size_t(plan.P) * plan.D * plan.T);
  std::vector<int> node_of(same_as.size());
  for (int s = 0; s < plan.P; ++s)
    for (int r = 0; r < plan.D; ++r)
      for (int t = 0; t < plan.T; ++t) {
        const size_t rank = size_t(g.world_rank(s, r, t));
        same_as[rank] = memory_part_key(s, t, plan.T, cfg.parallel.zero > 0);
        node_of[rank] = int(rank) / ranks_per_node;
      }
  return parts_span_nodes(same_as, node_of);
}

}  // namespace

PlanMemory plan_memory(const RunConfig& cfg, const RunPlan& plan, const ScheduleTheory& theory, bool gpu,
                       int nodes, int ranks_per_node) {
  PlanMemory out;
  out.planned = estimate_run_memory(cfg, plan, theory, gpu);
  const MemoryEstimate& e = out.planned.estimate;
  if (cfg.checkpoint.memory_every > 0) {
    // (the partner's part taken as large as this rank's: another stage's may differ)
    const bool partner = nodes > 1 && !replicas_span_nodes(cfg, plan, ranks_per_node);
    const double part = e.parameters + e.optimizer;
    out.memory_checkpoints = 2 * part * (partner ? 2 : 1) + (gpu ? 2 * part : 0);  // + a GPU's pinned buffers
  }
  out.peak = e.total() + (gpu ? 0 : out.memory_checkpoints);
  return out;
}

}  // namespace strata
