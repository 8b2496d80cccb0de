// `strata bench layers`: each layer of a config's model timed on this node's device, as
// training runs it (the same layer stack, backend and precision), into a machine profile
// (machine_profile.h): forward, whole backward, the zero-bubble schedules' B and W halves, per
// sample at a few micro-batch sizes (a kernel's fixed cost makes small batches dearer per
// sample), the median of `reps` runs or more after a warm-up; the optimizer's step and the
// loss; the step's batch from the loader over the config's data (and its upload to a device); the
// checkpoint write bandwidth to a directory (write + fsync of the model's state size) and the
// host memory bandwidth (a large copy).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "strata/comm.h"
#include "plan/machine_profile.h"

namespace strata {

struct LayerBenchOptions {
  std::vector<int64_t> micro_batches;  // empty: default_micro_batches(train.batch_size), >= 1
  int reps = 9;
  std::string checkpoint_dir;          // "" = the config's checkpoint directory
  std::function<void(const std::string&)> progress;  // one line per step of the measurement
  // The ranks of this node, all running bench layers (the others in bench_layers_busy_peer):
  // the whole pass is timed with all of them at once and alone (MachineProfile::busy_*).
  // Null or one rank: not measured.
  Comm* node = nullptr;
};

// The sizes measured by default for a global batch G: every power of two from G/16 up to G,
// and G. A layer's time per sample is not linear in the micro-batch where its working set
// crosses a cache level (a GPT block keeps about half a megabyte per sample of 64 tokens), so
// the sizes grids run at (G/D/M, powers of two for the usual G) are measured, not interpolated.
std::vector<int64_t> default_micro_batches(int64_t G);

// Throws UserError naming the file or key at fault (the config's data, the directory).
MachineProfile bench_layers(const RunConfig& cfg, const LayerBenchOptions& options);
// The other ranks of the node (LayerBenchOptions::node): the passes at once with rank 0, then
// a wait that leaves the core to rank 0 until it has timed the pass alone. Collective.
void bench_layers_busy_peer(const RunConfig& cfg, Comm& node, int reps);

// This node: CPU model, family and model number (/proc/cpuinfo), cores this process may use,
// and the versions of oneDNN, MPI and HDF5 linked; fills those fields of p.
void describe_node(MachineProfile& p);

}  // namespace strata
