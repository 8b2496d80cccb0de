// The checkpoint seam: how a file of a run's state is written. Each writer is a file of its
// own behind this interface:
//   rank0     rank0_writer.cpp: rank 0 writes the whole model (gathered for it) atomically; a
//             periodic write may go on in the background from a snapshot (checkpoint.async)
//   parallel  parallel_writer.cpp: every rank writes its ZeRO shard of its stage into the
//             same file with parallel HDF5, collectively
//   int8      int8_writer.cpp: an int8 parameter file (strata quantize)
// A run's writer is chosen once, with the reason, by choose_checkpoint_writer (the run plan);
// a new writer adds its file, its kind here and in make_checkpoint_writer, and a test.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/int8.h"
#include "model/model.h"
#include "model/optim.h"
#include "strata/comm.h"

namespace strata {

enum class CheckpointWriterKind { kRank0, kParallel, kInt8 };
const char* checkpoint_writer_name(CheckpointWriterKind kind);  // "rank0", "parallel", "int8"

// What a writer writes. rank0: `tensors` (the whole model's and its unsharded optimizer state,
// perhaps a snapshot of them), `model` for its description; parallel: `model` (this rank's
// stage) and `opt` (its shard); int8: `model` and `int8`'s products with `meta`.
struct CheckpointContent {
  const Model& model;
  Optimizer* opt = nullptr;
  std::vector<NamedTensor> tensors = {};
  TrainState state = {};
  Provenance prov = {};
  const Int8Table* int8 = nullptr;
  ParamFileMeta meta = {};
};

class CheckpointWriter {
 public:
  virtual ~CheckpointWriter() = default;
  virtual CheckpointWriterKind kind() const = 0;
  // Every rank writes (its shard, collectively, synchronously), or rank 0 alone.
  virtual bool every_rank_writes() const = 0;
  // Writes `path` atomically (a temporary name, fsync, rename: `path` is the previous file or
  // the complete new one); returns its bytes. Throws UserError (every_rank_writes: on every
  // rank alike).
  virtual int64_t write(const std::string& path, const CheckpointContent& c) = 0;
};

// `comm`: the run's (the parallel writer's collective); null for the others.
std::unique_ptr<CheckpointWriter> make_checkpoint_writer(CheckpointWriterKind kind, Comm* comm);

// A run's writer and why: parallel when checkpoint.writer allows it (auto, parallel) and the
// run can (ZeRO shards, no tensor parts, MPI, no node-local cache), else rank0 with the reason
// (for the start-up line). checkpoint.writer = parallel where it cannot is a UserError naming
// the key. Every rank gets the same answer.
struct CheckpointWriterChoice {
  CheckpointWriterKind kind = CheckpointWriterKind::kRank0;
  std::string why;
};
CheckpointWriterChoice choose_checkpoint_writer(const RunConfig& cfg, int tensor_parts,
                                                const Comm& comm);

}  // namespace strata
