#include "plan/plan_report.h"

#include <fmt/format.h>

#include "base/metrics.h"

namespace strata {
namespace {

std::string gb(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }
// "6.32 GB", or "52 MB" below 1 GB (a small limit reads as what it is).
std::string size_text(double bytes) {
  return bytes >= 1e9 ? fmt::format("{:.2f} GB", bytes / 1e9) : fmt::format("{:.0f} MB", bytes / 1e6);
}

std::string rate(double v) {
  return v >= 1e6 ? fmt::format("{:.2f}M", v / 1e6) : v >= 1e3 ? fmt::format("{:.1f}k", v / 1e3)
                                                                : fmt::format("{:.1f}", v);
}

std::string memory_parts(const PlanMemory& m, bool gpu) {
  const MemoryEstimate& e = m.planned.estimate;
  std::string s = fmt::format("parameters {} + gradients {} + optimizer {} + activations {} + "
                              "workspace {}", gb(e.parameters), gb(e.gradients), gb(e.optimizer),
                              gb(e.activations), gb(e.workspace));
  if (e.communication > 0) s += " + communication buffers " + gb(e.communication);
  if (e.whole_model > 0) s += " + whole model gathered " + gb(e.whole_model);
  s += " GB";
  if (m.memory_checkpoints > 0)  // the node's memory directory (tmpfs): host memory
    s += fmt::format(" {} memory checkpoints {} GB{}", gpu ? "; and in host memory," : "+",
                     gb(m.memory_checkpoints), gpu ? "" : " (the node's memory directory)");
  return s;
}

std::string time_parts(const StepTime& t) {
  return fmt::format("compute {:.4f} + bubble {:.4f} + exposed communication {:.4f} + optimizer "
                     "{:.4f} + checkpoint {:.4f} s", t.compute_s, t.bubble_s, t.exposed_comm_s,
                     t.optimizer_s, t.checkpoint_s);
}

std::string grid_keys_json(const GridChoice& g) {
  return fmt::format("{{\"parallel.pipeline_stages\": {}, \"parallel.tensor\": {}, \"parallel.zero\": {}, "
                     "\"parallel.schedule\": {}, \"parallel.virtual_stages\": {}, "
                     "\"parallel.microbatches\": {}, \"train.recompute\": {}, \"train.precision\": {}}}",
                     g.pipeline, g.tensor, g.zero, json_string(g.schedule), g.virtual_stages,
                     g.micro_batches, json_string(g.recompute ? "block" : "none"), json_string(g.precision));
}

std::string candidate_json(const Candidate& c) {
  const MemoryEstimate& e = c.memory.planned.estimate;
  std::string time = "null";
  if (c.timed)
    time = fmt::format("{{\"total_s\": {}, \"compute_s\": {}, \"bubble_s\": {}, \"exposed_comm_s\": {}, "
                       "\"optimizer_s\": {}, \"checkpoint_s\": {}, \"tensor_comm_s\": {}}}",
                       json_number(c.time.total_s), json_number(c.time.compute_s),
                       json_number(c.time.bubble_s), json_number(c.time.exposed_comm_s),
                       json_number(c.time.optimizer_s), json_number(c.time.checkpoint_s),
                       json_number(c.time.tensor_comm_s));
  return fmt::format(
      "{{\"keys\": {}, \"data_parallel\": {}, \"fits\": {}, \"shortfall_bytes\": {:.0f}, "
      "\"memory\": {{\"peak_bytes\": {:.0f}, \"stage\": {}, \"parameters\": {:.0f}, \"gradients\": {:.0f}, "
      "\"optimizer\": {:.0f}, \"activations\": {:.0f}, \"workspace\": {:.0f}, \"communication\": {:.0f}, "
      "\"whole_model\": {:.0f}, \"memory_checkpoints\": {:.0f}}}, \"step_time\": {}, \"throughput\": {}, "
      "\"reason\": {}}}",
      grid_keys_json(c.grid), c.grid.data, c.fits ? "true" : "false", c.shortfall, c.memory.peak,
      c.memory.planned.stage, e.parameters, e.gradients, e.optimizer, e.activations, e.workspace,
      e.communication, e.whole_model, c.memory.memory_checkpoints, time, c.timed ? json_number(c.throughput) : "null",
      json_string(c.reason));
}

}  // namespace

std::string plan_text(const PlanResult& r, const PlanRequest& req, const PlanHeader& h, int top) {
  int fitting = 0;
  for (const Candidate& c : r.candidates) fitting += c.fits;
  std::string out = fmt::format(
      "plan for {} on {} node{} x {} rank{} = {} rank{}, {:.2f} GB per rank ({})\n"
      "model: {}\ncommunication: {}; layer profile: {}\n"
      "grids: {} checked, {} fit, {} refused by the config's checks\n\n",
      h.config.empty() ? "the config" : h.config, req.nodes, req.nodes == 1 ? "" : "s",
      req.ranks_per_node, req.ranks_per_node == 1 ? "" : "s", req.ranks(), req.ranks() == 1 ? "" : "s",
      req.memory.bytes / 1e9, req.memory.source, h.model, h.comm,
      h.profile, r.candidates.size(), fitting, r.refused);
  out += fmt::format("{:>3}  {:<66} {:>9} {:>10} {:>11}  {}\n", "#", "grid", "memory GB",
                     "step s", r.unit, "why");
  for (int i = 0; i < int(r.candidates.size()) && i < top; ++i) {
    const Candidate& c = r.candidates[size_t(i)];
    const std::string why = c.fits ? c.reason : fmt::format("does not fit: {} short", size_text(c.shortfall));
    out += fmt::format("{:>3}  {:<66} {:>9} {:>10} {:>11}  {}\n", i + 1, describe_grid(c.grid),
                       gb(c.memory.peak), c.timed ? fmt::format("{:.4f}", c.time.total_s) : "-",
                       c.timed ? rate(c.throughput) : "-", why);
  }
  // The grids that fit fill the table: say how many do not, and the nearest of them.
  if (fitting > 0 && fitting < int(r.candidates.size())) {
    const Candidate& near = r.candidates[size_t(fitting)];
    out += fmt::format("({} grid{} do not fit; the nearest: {}, {} short)\n",
                       r.candidates.size() - size_t(fitting), r.candidates.size() - size_t(fitting) == 1 ? "" : "s",
                       describe_grid(near.grid), size_text(near.shortfall));
  }
  if (const Candidate* b = r.best()) {
    out += fmt::format("\nbest: {}\n  memory per rank {} GB (stage {}) = {}\n", describe_grid(b->grid),
                       gb(b->memory.peak), b->memory.planned.stage, memory_parts(b->memory, req.gpu));
    if (b->timed) out += fmt::format("  step {:.4f} s = {}\n", b->time.total_s, time_parts(b->time));
  } else {
    out += "\nno grid fits: the list is by shortfall\n";
  }
  out += "assumptions:\n";
  for (const std::string& a : r.assumptions) out += "  - " + a + "\n";
  return out;
}

std::string plan_json(const PlanResult& r, const PlanRequest& req, const PlanHeader& h) {
  std::string out = fmt::format(
      "{{\"config\": {}, \"nodes\": {}, \"ranks_per_node\": {}, \"ranks\": {}, "
      "\"memory_per_rank\": {:.0f}, \"memory_source\": {}, \"model\": {}, \"parameters\": {}, "
      "\"comm\": {}, \"profile\": {}, \"timed\": {}, \"unit\": {}, \"per_sample\": {}, \"refused\": {},\n "
      "\"assumptions\": [",
      json_string(h.config), req.nodes, req.ranks_per_node, req.ranks(), req.memory.bytes,
      json_string(req.memory.source), json_string(h.model), h.parameters, json_string(h.comm),
      json_string(h.profile), r.timed ? "true" : "false", json_string(r.unit), r.per_sample, r.refused);
  for (size_t i = 0; i < r.assumptions.size(); ++i) out += (i ? ", " : "") + json_string(r.assumptions[i]);
  out += "],\n \"grids\": [";
  for (size_t i = 0; i < r.candidates.size(); ++i) out += (i ? ",\n  " : "\n  ") + candidate_json(r.candidates[i]);
  return out + "]}\n";
}

std::string auto_plan_line(const PlanResult& r, const PlanRequest& req) {
  const Candidate& b = *r.best();
  int fitting = 0;
  for (const Candidate& c : r.candidates) fitting += c.fits;
  std::string s = fmt::format("plan: parallel.auto took {} on {} rank{}: {} per rank of {} ({}); {} "
                              "of {} grids fit", describe_grid(b.grid), req.ranks(), req.ranks() == 1 ? "" : "s",
                              size_text(b.memory.peak),
                              size_text(req.memory.bytes), req.memory.source, fitting, r.candidates.size());
  if (b.timed) s += fmt::format("; predicted step {:.4f} s, {} {}", b.time.total_s, rate(b.throughput), r.unit);
  // A run prints no assumptions list for an untimed reason to point to: say it here.
  return s + "; " + (b.timed ? b.reason : "untimed (no parallel.profile, and parallel.comm names no device): "
                                          "ranked by memory and by what costs time on any machine");
}

}  // namespace strata
