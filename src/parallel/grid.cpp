#include "parallel/grid.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {

int ProcessGrid::world_rank(int s, int r, int t) const {
  return (placement == "pipeline_in_node" ? r * stages + s : s * replicas + r) * tensors + t;
}

std::string ProcessGrid::where() const {
  return fmt::format("stage {} of {}, replica {} of {}{}", stage, stages, replica, replicas,
                     tensors > 1 ? fmt::format(", tensor part {} of {}", tensor, tensors) : "");
}

namespace {
int cores_for_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

int data_parallel_width(int ranks, int P, int T, int64_t batch_size) {
  if (ranks % (P * T) != 0)
    fail_input("parallel.pipeline_stages = {} x parallel.tensor = {} does not divide the {} "
               "ranks (each of the ranks / (P T) data-parallel replicas runs a whole model)",
               P, T, ranks);
  const int D = ranks / (P * T);
  if (batch_size % D != 0)
    fail_input("train.batch_size = {} is not divisible by the {} data-parallel replicas "
               "({} ranks / (parallel.pipeline_stages = {} x parallel.tensor = {}))",
               batch_size, D, ranks, P, T);
  return D;
}

ProcessGrid make_grid(Comm& world, int stages, int tensors, const std::string& placement,
                      int threads) {
  STRATA_CHECK(stages >= 1 && tensors >= 1 && world.size() % (stages * tensors) == 0,
               "{} ranks, {} stages, {} tensor parts", world.size(), stages, tensors);
  ProcessGrid g;
  g.stages = stages;
  g.tensors = tensors;
  g.replicas = world.size() / (stages * tensors);
  g.placement = placement;
  const int T = tensors, r = world.rank(), base = r / T;
  g.tensor = r % T;
  if (placement == "pipeline_in_node") {
    g.stage = base % stages;
    g.replica = base / stages;
  } else {
    g.stage = base / g.replicas;
    g.replica = base % g.replicas;
  }
  g.stage_comm = world.split(g.stage * T + g.tensor, g.replica);
  g.pipe_comm = world.split(g.replica * T + g.tensor, g.stage);
  g.tensor_comm = world.split(g.stage * g.replicas + g.replica, g.tensor);
  g.model_comm = world.split(g.replica, g.stage * T + g.tensor);
  if (stages > 1) {  // colors past every group's for the ranks in between
    const bool end = g.first_stage() || g.last_stage();
    auto c = world.split(end ? g.replica * T + g.tensor : g.replicas * T + r, g.stage);
    if (end) g.tied_comm = std::move(c);
  }
  g.hosts = world.all_hosts();
  g.node_ranks = int(std::count(g.hosts.begin(), g.hosts.end(), g.hosts[size_t(r)]));
  g.node_cores = cores_for_this_process();
  g.oversubscribed = g.node_ranks * threads > g.node_cores;
  g.pipe_comm->set_yielding_waits(g.oversubscribed);
  return g;
}

}  // namespace strata
