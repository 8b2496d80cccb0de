#include "plan/plan_memory.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/parse.h"
#include "parallel/pipeline.h"
#include "strata/error.h"

namespace strata {
namespace {

// data.path names something to open: a file that exists, a list or a glob (token shards).
bool data_present(const std::string& path) {
  if (path.starts_with("[") || path.find_first_of("*?") != std::string::npos) return true;
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace

PlanModel describe_plan_model(const RunConfig& cfg) {
  PlanModel m;
  if (data_present(cfg.data.path)) {
    m.info = open_dataset(cfg.data.path, {.format = cfg.data.format, .val_path = cfg.data.val_path,
                                          .vocab = cfg.model.vocab});
    if (m.info.tokens) set_context(m.info, cfg.model.context);
    m.source = cfg.data.path;
  } else if (cfg.model.type == "gpt" && cfg.model.vocab > 0) {
    // Only the shape is needed: context tokens per sample, vocab classes.
    m.info.tokens = true;
    m.info.vocab = m.info.classes = cfg.model.vocab;
    m.info.context = cfg.model.context;
    m.info.train.sample_shape = {cfg.model.context};
    m.source = fmt::format("the config (data.path {} not found: context {}, vocabulary {})",
                           cfg.data.path, cfg.model.context, cfg.model.vocab);
  } else {
    fail_input("data.path {}: not found; planning needs the data's shape (a GPT whose "
               "model.vocab or model.preset is set needs none)", cfg.data.path);
  }
  if (m.info.tokens && m.info.tokens != (cfg.model.type == "gpt"))
    fail_input("{}: holds tokens, which model.type = \"{}\" does not take", cfg.data.path, cfg.model.type);
  // The blocks' recompute flag changes no size or cost the plan uses: one description serves.
  m.model.input = m.info.train.sample_shape;
  m.model.classes = m.info.classes;
  m.model.layers = describe_layers(cfg.model_spec(m.info.classes), m.model.input, m.info.classes);
  m.model.tokens_per_sample = m.info.tokens ? m.info.context : 1;
  m.has_blocks = std::any_of(m.model.layers.begin(), m.model.layers.end(),
                             [](const LayerInfo& l) { return l.internal_bytes > 0; });
  m.rows_per_sample = numel(m.model.layers.back().out_shape) / std::max(1, m.info.classes);
  return m;
}

RankMemory rank_memory(const std::string& given, int ranks_per_node, const std::string& flag) {
  if (given.empty() || given == "auto") {
    const MemoryBound node = node_memory_limit();
    return {double(node.bytes) / ranks_per_node,
            ranks_per_node == 1 ? node.source
                                : fmt::format("{} / {} ranks per node", node.source, ranks_per_node)};
  }
  std::string why;
  const std::optional<double> bytes = parse_real(given, &why);
  if (!bytes || *bytes < 1)
    fail_input("{} {}: must be a byte count (e.g. 2e9) or auto{}", flag, given,
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

PlanMemory plan_memory(const RunConfig& cfg, const RunPlan& plan, const ScheduleTheory& theory, bool gpu) {
  PlanMemory out;
  out.planned = estimate_run_memory(cfg, plan, theory, gpu);
  out.peak = out.planned.estimate.total();
  return out;
}

}  // namespace strata
