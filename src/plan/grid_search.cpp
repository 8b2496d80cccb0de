#include "plan/grid_search.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n && d <= (int64_t(1) << 30); ++d)
    if (n % d == 0) out.push_back(int(d));
  return out;
}

// Interleaved: chunks per stage tried (the partition refuses more chunks than layers).
constexpr int kVirtualStages[] = {2, 3, 4, 6, 8};

// Every grid shape before the config's checks: D x P x T = ranks, then what each allows.
std::vector<GridChoice> enumerate(const RunConfig& cfg, const PlanModel& m, const PlanRequest& req,
                                  const std::vector<std::string>& precisions) {
  std::vector<GridChoice> out;
  const int ranks = req.ranks();
  const int layers = int(m.model.layers.size());
  for (int T : divisors(ranks)) {
    if (T > 1 && (req.gpu || !m.has_blocks)) break;  // validate() names the rest (heads)
    for (int P : divisors(ranks / T)) {
      if (P > layers) break;
      const int D = ranks / (P * T);
      if (cfg.train.batch_size % D != 0) continue;
      const int64_t per_replica = cfg.train.batch_size / D;
      std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
      if (P > 1) {
        for (const std::string& s : pipeline_schedules())
          if (s != "1f1b" && s != "interleaved") schedules.push_back({s, 1});
        for (int v : kVirtualStages)
          if (P * v <= layers) schedules.push_back({"interleaved", v});
      }
      for (int zero = 0; zero <= (D > 1 ? 2 : 0); ++zero)
        for (const auto& [schedule, v] : schedules)
          for (int M : divisors(per_replica)) {
            if (M > 4096) break;
            if (schedule == "interleaved" && M % P != 0) continue;
            for (int recompute = 0; recompute <= (m.has_blocks ? 1 : 0); ++recompute)
              for (const std::string& precision : precisions)
                out.push_back({.data = D, .pipeline = P, .tensor = T, .zero = zero,
                               .schedule = schedule, .micro_batches = M, .virtual_stages = v,
                               .recompute = recompute == 1, .precision = precision,
                               .ranks_per_node = req.ranks_per_node, .threads_per_rank = cfg.threads});
          }
    }
  }
  return out;
}

// Without step times: what costs time whatever the machine, least first.
auto untimed_key(const Candidate& c) {
  const GridChoice& g = c.grid;
  return std::make_tuple(g.pipeline, g.tensor, g.recompute, g.zero, g.micro_batches,
                         g.schedule != "1f1b", g.virtual_stages, c.memory.peak);
}

void rank(PlanResult& r) {
  std::stable_sort(r.candidates.begin(), r.candidates.end(), [&](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.shortfall < b.shortfall;
    if (r.timed && a.throughput != b.throughput) return a.throughput > b.throughput;
    if (r.timed) return a.memory.peak < b.memory.peak;
    return untimed_key(a) < untimed_key(b);
  });
}

// "2.6 GB"; below 1 GB in MB ("52 MB"): a small limit reads as what it is.
std::string gb(double bytes) {
  return bytes >= 1e9 ? fmt::format("{:.1f} GB", bytes / 1e9) : fmt::format("{:.0f} MB", bytes / 1e6);
}

}  // namespace

RunConfig with_grid(RunConfig cfg, const GridChoice& g) {
  cfg.parallel.pipeline_stages = g.pipeline;
  cfg.parallel.tensor = g.tensor;
  cfg.parallel.zero = g.zero;
  cfg.parallel.schedule = g.schedule;
  cfg.parallel.virtual_stages = g.virtual_stages;
  cfg.parallel.microbatches = g.micro_batches;
  cfg.parallel.stage_layers.clear();
  cfg.train.recompute = g.recompute ? "block" : "none";
  cfg.train.precision = g.precision;
  return cfg;
}

std::string describe_grid(const GridChoice& g) {
  std::string s = fmt::format("D {} x P {} x T {}, ZeRO {}", g.data, g.pipeline, g.tensor, g.zero);
  if (g.pipeline > 1)
    s += g.schedule == "interleaved" ? fmt::format(", interleaved v {}", g.virtual_stages) : ", " + g.schedule;
  if (g.micro_batches > 1) s += fmt::format(", {} micro-batches", g.micro_batches);
  if (g.recompute) s += ", recompute";
  return s + ", " + g.precision;
}

PlanResult search_grids(const RunConfig& cfg, const PlanModel& model, const PlanRequest& req,
                        const MachineProfile& profile, const CommModel& comm) {
  PlanResult r;
  r.timed = !profile.empty() || comm.device().present;
  r.per_sample = double(model.model.tokens_per_sample);
  if (model.info.tokens) r.unit = "tokens/s";
  std::vector<std::string> precisions = {cfg.train.precision};
  if (!cfg.given.count("train.precision") && profile.empty() && comm.device().present)
    precisions = {"bf16", "fp32"};
  std::map<std::tuple<std::string, int, int, int>, ScheduleTheory> theories;
  int untimed = 0;
  std::string first_untimed;
  for (const GridChoice& g : enumerate(cfg, model, req, precisions)) {
    const RunConfig c = with_grid(cfg, g);
    RunPlan plan;
    try {  // the checks `strata train` makes; a grid they refuse is not offered
      validate(c);
      plan = candidate_plan(c, model, req.ranks());
    } catch (const UserError&) {
      ++r.refused;
      continue;
    }
    auto key = std::make_tuple(g.schedule, plan.P, plan.M, plan.v);
    auto it = theories.find(key);
    if (it == theories.end())
      it = theories.emplace(key, plan.pipelined() ? schedule_theory(g.schedule, plan.P, plan.M, plan.v)
                                                  : ScheduleTheory{}).first;
    Candidate cand;
    cand.grid = g;
    cand.memory = plan_memory(c, plan, it->second, req.gpu, req.nodes, req.ranks_per_node);
    cand.fits = cand.memory.peak <= req.memory.bytes;
    cand.shortfall = cand.fits ? 0 : cand.memory.peak - req.memory.bytes;
    if (r.timed) {
      try {
        cand.time = predict_step_time(c, model.model, g, profile, comm);
      } catch (const UserError& e) {  // the model cannot time it: not offered, and said why
        if (untimed++ == 0) first_untimed = e.what();
        continue;
      }
      cand.timed = true;
      cand.throughput = double(cfg.train.batch_size) * r.per_sample / cand.time.total_s;
      cand.reason = cand.time.reason;
    } else {
      cand.reason = "untimed (see the assumptions)";
    }
    r.candidates.push_back(std::move(cand));
  }
  // A profile that times no grid (another model's, say) is the user's error, not an empty plan.
  if (untimed > 0 && r.candidates.empty()) throw UserError(kExitBadInput, first_untimed);
  if (untimed > 0)
    r.assumptions.push_back(fmt::format("{} grids left out: the step-time model cannot time them "
                                        "(the first: {})", untimed, first_untimed));
  r.refused += untimed;
  rank(r);
  // The step-time model's assumptions as they hold for the grid ranked first (its micro-batch).
  if (r.timed && !r.candidates.empty()) {
    const auto& first = (r.best() ? *r.best() : r.candidates.front()).time.assumptions;
    r.assumptions.insert(r.assumptions.begin(), first.begin(), first.end());
  }
  if (!r.timed)
    r.assumptions.push_back("compute times missing (no --profile, and the comm model names no "
                            "device): grids ranked by memory and by what costs time on any "
                            "machine, not by predicted step time");
  r.assumptions.push_back(fmt::format("memory per rank: {} ({})", gb(req.memory.bytes), req.memory.source));
  if (req.gpu)
    r.assumptions.push_back("GPU: device memory as the CPU backend's figures (fp32 master weights, "
                            "gradients and optimizer state; bf16 copies and library workspaces "
                            "not counted); T = 1 only (tensor parallelism runs on the CPU for now); "
                            "the whole model gathered for checkpoints is host memory, left out");
  return r;
}

std::string no_fit_message(const PlanResult& r, const PlanRequest& req, const std::string& where) {
  if (r.candidates.empty())
    return fmt::format("{}: no grid of {} rank{} passes the config's checks (parallel.* and "
                       "train.batch_size leave none; `strata train --check_grid {}` with a grid says "
                       "why)", where, req.ranks(), req.ranks() == 1 ? "" : "s", req.ranks());
  const Candidate* least = &r.candidates.front();
  for (const Candidate& c : r.candidates)
    if (c.memory.peak < least->memory.peak) least = &c;
  return fmt::format("{}: no grid of {} rank{} fits {} per rank ({}): the smallest needs {} ({}); "
                     "give more ranks or memory", where, req.ranks(), req.ranks() == 1 ? "" : "s",
                     gb(req.memory.bytes),
                     req.memory.source, gb(least->memory.peak), describe_grid(least->grid));
}

}  // namespace strata
