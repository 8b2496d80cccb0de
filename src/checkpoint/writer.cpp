#include "checkpoint/writer.h"

#include "strata/error.h"

namespace strata {

// Each writer's file defines its factory.
std::unique_ptr<CheckpointWriter> make_rank0_writer();
std::unique_ptr<CheckpointWriter> make_parallel_writer(Comm& comm);
std::unique_ptr<CheckpointWriter> make_int8_writer();

const char* checkpoint_writer_name(CheckpointWriterKind kind) {
  switch (kind) {
    case CheckpointWriterKind::kRank0: return "rank0";
    case CheckpointWriterKind::kParallel: return "parallel";
    case CheckpointWriterKind::kInt8: return "int8";
  }
  return "?";
}

std::unique_ptr<CheckpointWriter> make_checkpoint_writer(CheckpointWriterKind kind, Comm* comm) {
  switch (kind) {
    case CheckpointWriterKind::kRank0: return make_rank0_writer();
    case CheckpointWriterKind::kParallel:
      STRATA_CHECK(comm, "the parallel writer writes over the run's communicator");
      return make_parallel_writer(*comm);
    case CheckpointWriterKind::kInt8: return make_int8_writer();
  }
  STRATA_CHECK(false, "checkpoint writer kind {}", int(kind));
}

CheckpointWriterChoice choose_checkpoint_writer(const RunConfig& cfg, int tensor_parts,
                                                const Comm& comm) {
  std::string why;
  if (cfg.checkpoint.writer == "rank0") why = "checkpoint.writer = rank0";
  else if (cfg.parallel.zero == 0) why = "parallel.zero = 0: every replica holds the whole state";
  else if (tensor_parts > 1)
    why = "tensor parts are gathered on rank 0 (sharded writes cover data and pipeline "
          "parallelism, for now)";
  else if (!comm.mpi_handle()) why = "no MPI communicator (MPI-IO writes the file)";
  else if (!cfg.checkpoint.local_dir.empty())
    why = "checkpoint.local_dir: a node-local file cannot be written by every rank";
  if (why.empty())
    return {CheckpointWriterKind::kParallel,
            "every rank writes its shard (parallel HDF5 over MPI-IO, synchronous: "
            "checkpoint.writer = rank0 gathers and writes in the background)"};
  if (cfg.checkpoint.writer == "parallel") fail_input("checkpoint.writer = parallel: {}", why);
  return {CheckpointWriterKind::kRank0, why};
}

}  // namespace strata
