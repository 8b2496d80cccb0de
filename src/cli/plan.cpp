// `strata plan`: every grid the config allows on N nodes x R ranks, its memory per rank and
// step time predicted, the best first (docs/planning.md).
#include "cli/commands.h"

#include <fmt/format.h>

#include "plan/grid_search.h"
#include "plan/plan_report.h"
#include "run/memory_estimate.h"
#include "strata/error.h"

namespace strata::cli {
namespace {

struct PlanOpts {
  ConfigFlags config_flags;
  RunConfig cfg;
  CLI::Option* threads = nullptr;
  int nodes = 0, ranks_per_node = 0, top = 5;
  std::string profile, comm, memory = "auto", memory_key = "--memory_per_rank";
  bool json = false;
};
constexpr int64_t kMaxPlanRanks = int64_t(1) << 20;

CommModel read_comm(const std::string& path) {
  if (path.empty()) return CommModel{};
  return is_cluster_file(path) ? CommModel::from_cluster(path) : CommModel::from_profile(path);
}

// The flags, else the config's parallel.profile, parallel.comm and parallel.memory_per_rank
// (what --parallel.auto plans with), else none and auto.
void take_config_keys(PlanOpts& o) {
  const auto& p = o.cfg.parallel;
  if (o.profile.empty()) o.profile = p.profile;
  if (o.comm.empty()) o.comm = p.comm;
  if (o.memory == "auto" && p.memory_per_rank > 0) {
    o.memory = fmt::format("{:.17g}", p.memory_per_rank);
    o.memory_key = "parallel.memory_per_rank";
  }
}

int run_plan(PlanOpts& o) {
  apply_config(o.config_flags, o.cfg);
  o.cfg.threads = threads_from(o.threads, o.cfg.threads);
  validate(o.cfg);
  take_config_keys(o);
  if (const int64_t ranks = int64_t(o.nodes) * o.ranks_per_node; ranks > kMaxPlanRanks)
    fail_input("--nodes {} x --ranks-per-node {} = {} ranks: strata plan plans at most {}", o.nodes,
               o.ranks_per_node, ranks, kMaxPlanRanks);
  const MachineProfile profile = o.profile.empty() ? MachineProfile{} : read_machine_profile(o.profile);
  const CommModel comm = read_comm(o.comm);
  if (is_cluster_file(o.comm) && o.ranks_per_node > comm.ranks_per_node())
    fail_input("--ranks-per-node {}: the cluster description {} has ranks_per_node = {} (a rank "
               "per device)", o.ranks_per_node, o.comm, comm.ranks_per_node());
  const PlanModel model = describe_plan_model(o.cfg);
  PlanRequest req;
  req.nodes = o.nodes;
  req.ranks_per_node = o.ranks_per_node;
  req.gpu = comm.device().present || profile.device == "cuda";
  // A cluster description's device memory is what a rank has there, unless the flag says.
  if ((o.memory.empty() || o.memory == "auto") && comm.device().present && comm.device().memory_GB > 0)
    req.memory = {comm.device().memory_GB * 1e9,
                  fmt::format("the memory of one {} ({})", comm.device().name, o.comm)};
  else
    req.memory = rank_memory(o.memory, o.ranks_per_node, o.memory_key);
  const PlanResult r = search_grids(o.cfg, model, req, profile, comm);
  if (r.candidates.empty())  // nothing to rank: the config's checks refuse every grid
    throw UserError(kExitBadInput, no_fit_message(r, req, o.cfg.config_path.empty() ? "the config" : o.cfg.config_path));
  const ParameterCount n = count_parameters(model.model.layers);
  const PlanHeader h{.config = o.cfg.config_path,
                     .model = fmt::format("{} parameters, {}; shape from {}", thousands(n.used),
                                          o.cfg.model.type, model.source),
                     .comm = o.comm.empty() ? "none given: communication costs nothing (one node's "
                                              "defaults are not assumed)" : comm.source(),
                     .profile = o.profile.empty() ? "none" : o.profile,
                     .parameters = n.used};
  fmt::print("{}", o.json ? plan_json(r, req, h) : plan_text(r, req, h, o.top));
  return kExitOk;
}

}  // namespace

Subcommand add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  auto* plan = app.add_subcommand("plan", "predict every grid's memory per rank and step time on "
                                          "N nodes x R ranks, and rank them (docs/planning.md)");
  add_config_flags(*plan, o->config_flags);
  plan->add_option("--nodes", o->nodes, "nodes the run would have")->required()->check(int_in(1, 1 << 20));
  plan->add_option("--ranks_per_node,--ranks-per-node", o->ranks_per_node, "ranks per node")
      ->required()->check(int_in(1, 4096));
  plan->add_option("--profile", o->profile, "machine profile JSON (strata bench layers): times each grid");
  plan->add_option("--comm,--cluster", o->comm, "comm profile JSON (strata bench comm) or cluster description TOML");
  plan->add_option("--top", o->top, "grids printed")->check(int_in(1, 1000000))->capture_default_str();
  plan->add_flag("--json", o->json, "every grid as JSON, for scripts");
  plan->add_option("--memory_per_rank", o->memory,
                   "bytes a rank may take, or auto (the node's MemTotal or the job's cgroup limit, "
                   "over its ranks; a cluster file's device memory)")->capture_default_str();
  o->threads = plan->add_option("--threads", o->cfg.threads, "math threads per rank (default SLURM_CPUS_PER_TASK, else 1)")
      ->check(int_in(1, kMaxThreads));
  return {plan, [o](Comm& comm) {
            int code = kExitOk;
            // Every rank reads the same inputs; rank 0 alone prints.
            collectively(comm, [&] {
              if (comm.rank() == 0) code = run_plan(*o);
            });
            return code;
          }};
}

}  // namespace strata::cli
