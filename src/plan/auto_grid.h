// parallel.auto: the grid chosen for the ranks a run was launched on, before anything is built.
#pragma once
#include "config/config.h"
#include "strata/comm.h"

namespace strata {

// Collective. Rank 0 plans for the job's nodes and ranks per node (counted from the ranks'
// hosts) and takes the best grid that fits parallel.memory_per_rank; the choice is broadcast
// and every rank sets its keys in `cfg` (the same decision everywhere, whatever each node's
// memory reads). Rank 0 prints a `plan:` line saying which grid and why. A config no grid fits
// throws UserError(kExitBadInput) on every rank, naming the smallest grid's shortfall.
void apply_auto_grid(RunConfig& cfg, Comm& comm);

// train --check_grid RANKS under parallel.auto: whether some grid fits RANKS ranks placed
// `ranks_per_node` to a node (0: all on one), each with this node's memory over its node's
// ranks; sets the grid keys in `cfg` as apply_auto_grid would, or throws its UserError. Rank 0
// prints the `plan:` line.
void apply_auto_grid_for(RunConfig& cfg, Comm& comm, int ranks, int ranks_per_node);

}  // namespace strata
