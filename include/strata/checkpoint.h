// Parameter files: the trained parameters by global name, readable by h5py (README: "Parameter
// file layout"). Full resumable checkpoints build on this layout.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "strata/model.h"

namespace strata {

struct ParamFileMeta {
  std::string config_toml;  // the effective config of the run that wrote it
  std::string dataset_sha256;
  int64_t step = 0;
};

// Writes every parameter as /params/<layer>/<name> (float32, its global shape), the model
// spec, input shape and class count as root attributes. Written to a temporary name, fsynced
// and renamed, so a crash never leaves a partial file under `path`.
void save_parameters(const std::string& path, Model& model, const ParamFileMeta& meta);

struct LoadedParams {
  ModelSpec spec;
  Shape input_shape;
  int classes = 0;
  std::map<std::string, std::vector<float>> tensors;  // by global name "fc1.weight"
  std::map<std::string, Shape> shapes;
  std::string config_toml;
};
// Throws UserError naming the file for a missing/unreadable file or a wrong layout.
LoadedParams load_parameters(const std::string& path);
// Copies the file's parameters into a model built from its spec (sizes checked).
void copy_parameters_into(Model& model, const LoadedParams& p, const std::string& path);

}  // namespace strata
