#include "strata/grid.h"

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {

int ProcessGrid::world_rank(int s, int r) const {
  return placement == "pipeline_in_node" ? r * stages + s : s * replicas + r;
}

std::string ProcessGrid::where() const {
  return fmt::format("stage {} of {}, replica {} of {}", stage, stages, replica, replicas);
}

ProcessGrid make_grid(Comm& world, int stages, const std::string& placement) {
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
  return g;
}

}  // namespace strata
