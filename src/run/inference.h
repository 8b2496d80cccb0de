// A model loaded from a file for inference: what eval, generate and quantize share.
#pragma once
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/int8.h"
#include "model/model.h"
#include "strata/backend.h"

namespace strata {

struct InferenceModel {
  LoadedParams params;       // what the file holds: the model's spec, shapes, tensors
  const Backend* be = nullptr;
  std::string device_note;   // what the backend is and why it was chosen
  std::unique_ptr<Model> model;
  std::unique_ptr<Int8Table> int8;  // an int8 file's products (strata quantize), else empty
  bool is_int8() const { return int8 && !int8->weights.empty(); }
};

// Loads a parameter file or checkpoint `path` for inference on `device` (auto: the GPU when
// this rank sees one; the CPU for an int8 file, int8 inference being the CPU's) with
// `threads` CPU threads: a device named is checked before the file is read; then the model's
// memory, the model built and filled, an int8 file's products set, the backend's ops
// checked, the model placed on the backend. Throws UserError naming the file or device.
InferenceModel load_for_inference(const std::string& path, const std::string& device, int threads);

}  // namespace strata
