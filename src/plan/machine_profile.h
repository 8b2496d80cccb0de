// A machine profile: what one node's device takes for each layer of one model at a precision
// and thread count, measured by `strata bench layers` (layer_bench.h), and what the node is
// (CPU, GPU, library versions), so a step-time prediction (step_time.h) can say what it rests
// on. Written and read as JSON:
//   {"strata_machine_profile": 1, "device": "cpu", "precision": "fp32", "threads": 1,
//    "cores": 2, "cpu": {"model": ..., "family": ..., "model_id": ...}, "gpu": "",
//    "versions": {"strata": ..., "onednn": ..., "mpi": ..., "hdf5": ...}, "date": ...,
//    "config": ..., "model": {"type": "gpt", "layers": L},
//    "micro_batches": [1, 4, 16],
//    "layers": [{"index": i, "name": "block1", "kind": "Block(...)", "params": n,
//                "flops": per-sample forward FLOPs, "splits": true,
//                "optimizer_s": s per step,
//                "at": [{"micro_batch": b, "forward_s": s, "backward_s": s,
//                        "backward_input_s": s, "backward_weight_s": s}, ...]}, ...],
//    "loss": {"at": [{"micro_batch": b, "forward_s": s}...]},
//    "whole": {"at": [{"micro_batch": b, "forward_s": s}...]},
//    "input": {"at": [{"micro_batch": b, "forward_s": s}...]} (the loader's batch, a device's upload),
//    "checkpoint_write_Bps": bytes/s, "checkpoint_bytes": n, "memory_Bps": bytes/s,
//    "busy": {"ranks": R, "slowdown": s} (launched on R ranks of a node; absent on one),
//    "cpu_share": CPU time / wall time while timing}
// Every "_s" under "at" is seconds per SAMPLE at that micro-batch size; "backward_s" is the
// whole backward (B and W in one pass, as gpipe and 1f1b run it), "backward_input_s" and
// "backward_weight_s" the zero-bubble schedules' halves (B holds all of it for a layer that
// does not split).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata {

// One layer's figures at one micro-batch size: seconds per sample.
struct LayerTiming {
  int64_t micro_batch = 1;
  double forward_s = 0, backward_s = 0, backward_input_s = 0, backward_weight_s = 0;
};

struct LayerProfile {
  int index = 0;
  std::string name, kind;  // kind: the layer's description ("Linear(784 -> 256)")
  int64_t params = 0;
  double flops = 0;        // forward, per sample
  bool splits = false;     // backward splits into B and W
  double optimizer_s = 0;  // the optimizer's update of this layer's parameters, per step
  std::vector<LayerTiming> at;  // by micro_batch, ascending
};

// Seconds for one micro-batch of `micro_batch` samples, interpolated linearly in the micro-batch
// size between the measured sizes (the per-micro-batch time, not the per-sample time: a
// kernel's fixed cost is what makes small batches dear), extrapolated at the ends from the
// nearest two (or in proportion from a single size).
struct MicroBatchCost {
  double forward_s = 0, backward_s = 0, backward_input_s = 0, backward_weight_s = 0;
};

struct MachineProfile {
  std::string path;  // where it was read from ("" if made here)
  std::string device = "cpu", precision = "fp32", cpu_model, cpu_family, cpu_model_id, gpu;
  int threads = 1, cores = 1;
  std::map<std::string, std::string> versions;
  std::string date, config, model_type;
  std::vector<int64_t> micro_batches;
  std::vector<LayerProfile> layers;
  std::vector<LayerTiming> loss;  // the loss and its gradient (forward_s only)
  // The whole model's forward, loss and backward run at once, without a timer or a device
  // synchronisation between layers, as training runs them (forward_s only; absent in
  // profiles written before it was measured). Per-layer timing sees each layer on its own:
  // what runs between layers (layout conversions, a layer's output still in cache for the
  // next, the timer itself) is in the step but not in the sum of the layers, or the other way.
  std::vector<LayerTiming> whole;
  // The step's batch from the loader (its rows gathered and converted, or the wait for the
  // reader thread) and, on a device, its copy into the device's memory (inputs and labels):
  // once a step before its first forward (forward_s only; for a preset without a data file
  // the upload alone, on the host none; empty in profiles written before it was measured).
  std::vector<LayerTiming> input;
  double checkpoint_write_Bps = 0;
  int64_t checkpoint_bytes = 0;
  double memory_Bps = 0;
  // The process's CPU time over the wall time (per thread) while the layers were timed: 1 on a
  // node of its own; less where other work took the cores, whose share the figures then include.
  double cpu_share = 1;
  // The whole pass on every rank of a node at once over the same pass alone, `strata bench
  // layers` launched on busy_ranks ranks of one node: what the ranks share (caches, memory
  // bandwidth, clocks) slows each. 1 rank and no slowdown where it ran on one.
  int busy_ranks = 1;
  double busy_slowdown = 1;

  bool empty() const { return layers.empty(); }
  // The slowdown of a rank's compute while `ranks` ranks of its node compute: none for one,
  // the measured one from busy_ranks on, in proportion to the other ranks in between.
  double busy_factor(int ranks) const;
  // Layer `index`'s profile, or, when the model differs (another depth), the first layer of
  // the same kind; null if neither.
  const LayerProfile* find(int index, const std::string& kind) const;
  // A profiled layer's cost at `micro_batch` samples (interpolated).
  static MicroBatchCost cost(const LayerProfile& l, double micro_batch);
  double loss_s(double micro_batch) const;
  // The step's `batch` samples from the loader (and into the device's memory): seconds, 0
  // without a figure.
  double input_s(double batch) const;
  // The whole pass at `micro_batch` over the sum of the layers' forward and backward and the
  // loss there (interpolated alike): what the step-time model scales the layers' figures by.
  // 1 without a whole-pass measurement.
  double whole_ratio(double micro_batch) const;
};

// Throws UserError(kExitBadInput) naming the file and the key at fault.
MachineProfile read_machine_profile(const std::string& path);
std::string machine_profile_json(const MachineProfile& p);
// Writes atomically (base/files.h).
void write_machine_profile(const std::string& path, const MachineProfile& p);

}  // namespace strata
