#include "plan/auto_grid.h"

#include <algorithm>
#include <array>
#include <map>

#include <fmt/format.h>

#include "plan/grid_search.h"
#include "plan/plan_report.h"
#include "strata/error.h"

namespace strata {
namespace {

// Nodes = distinct hosts; ranks per node = the most on one host. `*sharing`: the most ranks
// on one host, which share its memory, also where uneven hosts plan the ranks one to a node.
PlanRequest job_request(Comm& comm, int* sharing) {
  std::map<std::string, int> per_host;
  for (const std::string& h : comm.all_hosts()) ++per_host[h];
  PlanRequest req;
  req.nodes = int(per_host.size());
  for (const auto& [host, n] : per_host) req.ranks_per_node = std::max(req.ranks_per_node, n);
  *sharing = req.ranks_per_node;
  if (req.nodes * req.ranks_per_node != comm.size()) {  // uneven: plan the ranks as they are
    req.nodes = comm.size();
    req.ranks_per_node = 1;
  }
  return req;
}

// The keys parallel.auto chooses (with_grid): one the file or a flag gave is replaced, said
// once, and its value is not checked (only the grid chosen is).
void say_replaced_keys(const RunConfig& cfg) {
  std::string replaced;
  for (const char* k : {"parallel.pipeline_stages", "parallel.tensor", "parallel.zero", "parallel.schedule",
                        "parallel.virtual_stages", "parallel.microbatches", "parallel.stage_layers",
                        "train.recompute"})  // (train.precision given is kept: the search keeps it)
    if (auto it = cfg.given.find(k); it != cfg.given.end())
      replaced += fmt::format("{}{} ({})", replaced.empty() ? "" : ", ", k, it->second);
  if (!replaced.empty())
    fmt::print(stderr, "strata: warning: parallel.auto chooses the grid; these keys given are replaced: {}\n",
               replaced);
}

int index_of(const std::vector<std::string>& v, const std::string& s) {
  return int(std::find(v.begin(), v.end(), s) - v.begin());
}

}  // namespace

void apply_auto_grid(RunConfig& cfg, Comm& comm) { apply_auto_grid_for(cfg, comm, 0, 0); }

void apply_auto_grid_for(RunConfig& cfg, Comm& comm, int ranks, int ranks_per_node) {
  int sharing = 1;
  PlanRequest req = job_request(comm, &sharing);
  if (ranks > 0) {
    const int per_node = ranks_per_node > 0 ? ranks_per_node : ranks;
    if (ranks % per_node != 0)
      fail_input("--check_grid_ranks_per_node {} does not divide --check_grid {}", per_node, ranks);
    req = PlanRequest{};
    req.nodes = ranks / per_node;
    req.ranks_per_node = sharing = per_node;
  }
  const std::vector<std::string> precisions = {"fp32", "bf16"};
  // P, T, ZeRO, schedule, M, v, recompute, precision
  std::array<int, 8> chosen{};
  collectively(comm, [&] {
    if (comm.rank() != 0) return;
    say_replaced_keys(cfg);
    validate(with_grid(cfg, GridChoice{}));  // every other key as given
    const PlanModel model = describe_plan_model(cfg);
    req.memory = cfg.parallel.memory_per_rank > 0
                     ? RankMemory{cfg.parallel.memory_per_rank,
                                  fmt::format("parallel.memory_per_rank = {:g}", cfg.parallel.memory_per_rank)}
                     : rank_memory("auto", sharing, "parallel.memory_per_rank");
    const MachineProfile profile =
        cfg.parallel.profile.empty() ? MachineProfile{} : read_machine_profile(cfg.parallel.profile);
    CommModel cm;
    if (!cfg.parallel.comm.empty())
      cm = is_cluster_file(cfg.parallel.comm) ? CommModel::from_cluster(cfg.parallel.comm)
                                              : CommModel::from_profile(cfg.parallel.comm);
    // On GPUs: T = 1 and device memory (an --device auto run on a GPU node is planned as the
    // CPU's unless the profile or the comm model says GPU: set parallel.memory_per_rank there).
    req.gpu = cfg.device == "cuda" || profile.device == "cuda" || cm.device().present;
    const PlanResult r = search_grids(cfg, model, req, profile, cm);
    const Candidate* best = r.best();
    if (!best)
      throw UserError(kExitBadInput,
                      no_fit_message(r, req, cfg.config_path.empty() ? "the config" : cfg.config_path));
    const GridChoice& g = best->grid;
    chosen = {g.pipeline, g.tensor, g.zero, index_of(pipeline_schedules(), g.schedule), g.micro_batches,
              g.virtual_stages, g.recompute ? 1 : 0, index_of(precisions, g.precision)};
    fmt::print("{}\n", auto_plan_line(r, req));
  });
  comm.broadcast(chosen.data(), int64_t(sizeof chosen), 0);
  cfg = with_grid(cfg, {.pipeline = chosen[0], .tensor = chosen[1], .zero = chosen[2],
                        .schedule = pipeline_schedules()[size_t(chosen[3])],
                        .micro_batches = chosen[4], .virtual_stages = chosen[5],
                        .recompute = chosen[6] == 1, .precision = precisions[size_t(chosen[7])]});
}

}  // namespace strata
