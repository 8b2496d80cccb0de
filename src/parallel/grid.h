// The process grid: pipeline stages × data-parallel replicas × tensor-parallel ranks, built
// from MPI communicators.
//
// Every rank belongs to one stage group (the ranks holding the same layers and the same
// tensor part, one per replica: the gradient allreduce runs over it), to one pipeline (one
// rank per stage, same replica and tensor part, in stage order: activations and their
// gradients pass between neighbours in it) and to one tensor group (the ranks splitting the
// same stage of the same replica: a block's allreduces run over it).
//
// The tensor group is innermost: its T ranks are consecutive (rank = base * T + tensor part),
// since its allreduces come twice per block in forward and backward, on the critical path;
// `base` is then placed as follows.
//
// Placement (parallel.placement) chooses which groups get consecutive ranks. Slurm and mpirun
// fill nodes with consecutive ranks, so consecutive ranks share a node's memory bus:
//   replicas_in_node (default)  rank = stage * D + replica: a stage's replicas are neighbours,
//                               so the gradient allreduce (the whole stage's parameters every
//                               step) stays inside a node, and only activations (a
//                               micro-batch's boundary tensor) cross nodes. Megatron-LM's
//                               order, with the pipeline outermost.
//   pipeline_in_node            rank = replica * P + stage: a pipeline's stages are
//                               neighbours; the activations stay inside a node.
// World rank 0 is stage 0 of replica 0 either way.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.h"

namespace strata {

struct ProcessGrid {
  int stages = 1, replicas = 1, tensors = 1;  // P, D and T
  int stage = 0, replica = 0, tensor = 0;     // this rank's place
  std::string placement = "replicas_in_node";
  std::unique_ptr<Comm> stage_comm;   // same stage and tensor part, every replica (rank = replica)
  std::unique_ptr<Comm> pipe_comm;    // same replica and tensor part, every stage (rank = stage)
  std::unique_ptr<Comm> tensor_comm;  // same stage and replica (rank = tensor part)
  std::unique_ptr<Comm> model_comm;   // same replica: the whole model (the gradient norm)
  // With P > 1: the first and last stage of the same replica and tensor part (the token
  // table's gradient, shared by a GPT's embedding and output layer); null elsewhere.
  std::unique_ptr<Comm> tied_comm;
  // This node runs more ranks x threads than it has cores for this process: a rank waiting
  // for a neighbour then sleeps between polls instead of spinning (pipe_comm is so set).
  bool oversubscribed = false;
  int node_ranks = 1, node_cores = 1;
  std::vector<std::string> hosts;  // of every world rank (provenance, the grid map)

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  // World rank of (stage, replica, tensor part) under this placement.
  int world_rank(int stage, int replica, int tensor = 0) const;
  // "stage 1 of 2, replica 0 of 2" (", tensor part 1 of 2" when T > 1)
  std::string where() const;
};

// The data-parallel width D = ranks / (P T) of a grid of P pipeline stages x T tensor parts;
// throws UserError (naming parallel.pipeline_stages, parallel.tensor or train.batch_size) when
// P T does not divide the ranks or D does not divide the global batch.
int data_parallel_width(int ranks, int P, int T, int64_t batch_size);

// Collective over `world`. world.size() must be a multiple of stages x tensors (checked by the
// caller); threads: math threads per rank.
ProcessGrid make_grid(Comm& world, int stages, int tensors, const std::string& placement,
                      int threads);

}  // namespace strata
