// `strata bench comm`: the time of the collectives training uses (through the Comm seam, so
// the figures are those of strata's own calls), per message size, within a node and across
// nodes, every result checked; and the profile `strata plan` reads (comm_profile.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/comm_profile.h"
#include "strata/comm.h"

namespace strata {

struct CommBenchOptions {
  int64_t min_bytes = 8, max_bytes = int64_t(1) << 30;  // powers of 2, whole buffer per rank
  std::vector<CommOp> ops = {CommOp::allreduce, CommOp::reduce_scatter, CommOp::all_gather,
                             CommOp::sendrecv};
  int iters = 20, warmup = 5;
  int rounds = 3;  // sweeps over every op and size; the median of their figures is kept
  std::string device = "cpu";  // cpu | cuda (NCCL) | cpu-staged (the device path on the CPU)
  bool progress = true;        // a line per size on rank 0 (stderr)
};

// Checks what every rank must agree on before the first collective (UserError, exit 2, naming
// the flag): sizes, and at least 2 ranks when a collective is asked for.
void check_comm_bench_options(const CommBenchOptions& o, int ranks);

// Collective over `world`: measures every op at every size at each level this launch has
// (intra: >= 2 ranks on a node; inter: >= 2 nodes), and fits each op and level. Nodes are told
// apart by slurm_node_name() ($SLURMD_NODENAME, else the host). A wrong result anywhere is a
// UserError(kExitInternal) naming op, size, level, rank and the first bad index.
// STRATA_BENCH_COMM_CORRUPT=OP:RANK (a test hook) adds 1 to one input element of RANK's
// checked OP, so the check has something to find.
CommProfile run_comm_bench(Comm& world, const CommBenchOptions& o);

}  // namespace strata
