// HDF5 files strata writes: parameter files (the trained model) and checkpoints (everything a
// run needs to continue bit for bit). Both keep tensors by global name and global shape, so any
// grid reads them, and both are readable by h5py (docs/checkpoints.md, "Checkpoint and parameter file layout").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/int8.h"
#include "model/model.h"
#include "model/optim.h"
#include "strata/comm.h"

namespace strata {

// Where a run stands and where it came from; root attributes of a checkpoint.
struct TrainState {
  int64_t step = 0;        // optimizer steps completed
  int64_t epoch = 0;       // position of the NEXT batch in the data order:
  int64_t batch = 0;       //   batch `batch` of epoch `epoch`
  int64_t sequence = 0;    // 1 for a lineage's first checkpoint, +1 for each after it
  int64_t global_batch = 0;
  uint64_t seed = 0;
  std::string optimizer;   // sgd | adamw
  int64_t optimizer_steps = 0;
};

struct Provenance {
  std::string config_toml;  // the effective config of the run that wrote it
  std::string dataset_path, dataset_sha256;
  int64_t grid_ranks = 1, grid_data_parallel = 1, grid_stages = 1, grid_tensor = 1;
  std::string slurm_job_id;  // "" outside Slurm
  int64_t slurm_restart_count = 0;
  std::vector<std::string> hosts;  // host of each rank
  std::string created_utc;         // ISO 8601
  // The training data's tokenizer attributes (data/tokenizer_identity.h), copied into the file.
  std::map<std::string, std::string> tokenizer;
};

// A tensor to write: global name ("fc1.weight"), its HDF5 path, shape and data.
struct NamedTensor {
  std::string path;  // "/params/fc1/weight", "/optimizer/momentum/fc1/weight"
  Shape shape;
  const float* data = nullptr;
};

struct LoadedCheckpoint {
  std::string format;  // "strata-checkpoint", "strata-parameters" or "strata-int8"
  ModelSpec spec;
  Shape input_shape;
  int classes = 0;
  TrainState state;
  Provenance prov;
  std::map<std::string, std::vector<float>> tensors;  // by HDF5 path
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::string> checksum;  // by HDF5 path: "ok", "MISMATCH ...", "none"
  bool verified = true;  // every tensor that has a checksum matches it
  int64_t tensor_bytes = 0;
  double read_seconds = 0;  // opening, reading and verifying every tensor
  Int8Table int8;           // an int8 file's quantized products (strata quantize)
};

// Reads a checkpoint or parameter file and checks every tensor's CRC-32. A file that is missing,
// truncated or not HDF5, or whose layout is wrong, throws UserError(kExitBadCheckpoint) naming
// it; a checksum mismatch throws too unless `tolerate_mismatch` (for `strata inspect`).
// quarantine_if_damaged: a read that HDF5 cannot finish (read_guard.h) renames the file
// FILE.corrupt before the process exits (the resume path's choice).
LoadedCheckpoint read_checkpoint(const std::string& path, bool tolerate_mismatch = false,
                                 bool quarantine_if_damaged = false);

// The tensors of a model and its optimizer state under their checkpoint paths.
std::vector<NamedTensor> model_tensors(const Model& model);
std::string param_path(const std::string& global_name);  // "fc1.weight" -> "/params/fc1/weight"

// Parameter files: /params/... with checksums and the model description; no optimizer state.
struct ParamFileMeta {
  std::string config_toml;
  std::string dataset_sha256;
  int64_t step = 0;
  std::map<std::string, std::string> tokenizer;  // as Provenance::tokenizer
};
void save_parameters(const std::string& path, const Model& model, const ParamFileMeta& meta);

// The model-defining part of any of the three kinds of file (for `strata eval`).
using LoadedParams = LoadedCheckpoint;
LoadedParams load_parameters(const std::string& path);
// Copies the file's parameters into a model with the same spec (sizes checked); for an int8
// file, also its int8 products into `int8` (each checked against the model's int8_targets),
// which the model then runs (set_int8). The weights replaced by int8 stay zero in fp32.
void copy_parameters_into(Model& model, const LoadedParams& p, const std::string& path,
                          Int8Table* int8 = nullptr);

}  // namespace strata
