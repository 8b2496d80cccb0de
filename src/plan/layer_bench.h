// `strata bench layers`: each layer of a config's model timed on this node's device, as
// training runs it (the same layer stack, backend and precision), into a machine profile
// (machine_profile.h): forward, whole backward, the zero-bubble schedules' B and W halves, per
// sample at a few micro-batch sizes (a kernel's fixed cost makes small batches dearer per
// sample), the median of `reps` runs after a warm-up; the optimizer's step and the loss; the
// checkpoint write bandwidth to a directory (write + fsync of the model's state size) and the
// host memory bandwidth (a large copy).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/machine_profile.h"

namespace strata {

struct LayerBenchOptions {
  std::vector<int64_t> micro_batches;  // empty: G/16, G/4 and G (G = train.batch_size), >= 1
  int reps = 9;
  std::string checkpoint_dir;          // "" = the config's checkpoint directory
  std::function<void(const std::string&)> progress;  // one line per step of the measurement
};

// Throws UserError naming the file or key at fault (the config's data, the directory).
MachineProfile bench_layers(const RunConfig& cfg, const LayerBenchOptions& options);

// This node: CPU model, family and model number (/proc/cpuinfo), cores this process may use,
// and the versions of oneDNN, MPI and HDF5 linked; fills those fields of p.
void describe_node(MachineProfile& p);

}  // namespace strata
