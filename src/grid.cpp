#include "strata/grid.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {

int ProcessGrid::world_rank(int s, int r) const {
  return placement == "pipeline_in_node" ? r * stages + s : s * replicas + r;
}

std::string ProcessGrid::where() const {
  return fmt::format("stage {} of {}, replica {} of {}", stage, stages, replica, replicas);
}

namespace {
int cores_for_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ProcessGrid make_grid(Comm& world, int stages, const std::string& placement, int threads) {
  STRATA_CHECK(stages >= 1 && world.size() % stages == 0, "{} ranks, {} stages", world.size(), stages);
  ProcessGrid g;
  g.stages = stages;
  g.replicas = world.size() / stages;
  g.placement = placement;
  const int r = world.rank();
  if (placement == "pipeline_in_node") {
    g.stage = r % stages;
    g.replica = r / stages;
  } else {
    g.stage = r / g.replicas;
    g.replica = r % g.replicas;
  }
  g.stage_comm = world.split(g.stage, g.replica);
  g.pipe_comm = world.split(g.replica, g.stage);
  g.hosts = world.all_hosts();
  g.node_ranks = int(std::count(g.hosts.begin(), g.hosts.end(), g.hosts[size_t(r)]));
  g.node_cores = cores_for_this_process();
  g.oversubscribed = g.node_ranks * threads > g.node_cores;
  g.pipe_comm->set_yielding_waits(g.oversubscribed);
  return g;
}

}  // namespace strata
