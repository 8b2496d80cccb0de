// The layer stack: a model description (config/model_spec.h) built into layers, sizes
// inferred, shapes checked and neighbours fused; and what each built layer costs, for the
// pipeline's partition, memory checks and reports, with nothing allocated.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/model_spec.h"
#include "model/layers.h"

namespace strata {

// The whole model's layers (fused, named "fc1", "block2", ...): shapes[i] is the per-sample
// shape entering layer i, shapes.back() the model's output.
struct LayerStack {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Shape> shapes;
};
// Throws UserError naming the bad layer spec or shape mismatch; `where` names the spec's
// source in errors: "model.layers", or "FILE: attribute model_layers". tp: this rank's part of
// the tensor-parallel group (transformer blocks are split over it).
LayerStack build_layers(const ModelSpec& spec, const Shape& input_shape, int classes,
                        TensorSplit tp = {}, const std::string& where = "model.layers");

// Floats a layer's parameters hold (this rank's share), and the floats they span in the flat
// buffers (each tensor padded: flat_span), this rank's share and unsplit (the layout of
// checkpoints' whole blocks).
int64_t param_count(const Layer& l);
int64_t flat_count(const Layer& l);
int64_t whole_flat_count(const Layer& l);

// One built layer of the whole model, for partitioning and reports.
struct LayerInfo {
  std::string name, describe;
  Shape in_shape, out_shape;  // per sample
  int64_t params = 0;
  int64_t padding = 0;  // of params: never used (the token table's padding rows)
  int64_t flat = 0;  // floats its tensors span in the flat buffers (each padded: flat_span)
  std::vector<int64_t> tensors;  // each parameter tensor's floats (unsplit), in the layer's order
  double flops = 0;  // forward, per sample
  int64_t internal_bytes = 0;  // per sample, kept for backward besides the output (blocks)
  bool recomputes = false;     // recomputed in backward instead (train.recompute = block)
  bool reshape = false;        // a view of its input (flatten): no buffer of its own
};
std::vector<LayerInfo> describe_layers(const ModelSpec& spec, const Shape& input_shape, int classes,
                                       const std::string& where = "model.layers");
// Every parameter's global name ("fc1.weight") and whole shape, in layer order (a file's
// tensors are checked against these before they are read).
std::vector<std::pair<std::string, Shape>> describe_params(const ModelSpec& spec,
                                                           const Shape& input_shape, int classes,
                                                           const std::string& where = "model.layers");

// Layers [first, last) of the built stack (after fusion, as the model summary prints them).
// last = -1: to the end.
struct LayerRange {
  int first = 0, last = -1;
};

// Refuses, before anything is allocated, a model whose layers `range` cannot fit in this
// node's memory: `copies` float copies of their parameters (values, gradients, optimizer
// state), split over `tensor_parts` ranks, plus one batch of `batch_samples` samples'
// activations. A lower bound of what the run will take, so it never refuses one that fits;
// the message names the largest layer. Throws UserError(kExitBadInput).
void require_model_memory(const std::vector<LayerInfo>& layers, LayerRange range, double copies,
                          int tensor_parts, int64_t batch_samples, const std::string& who);
// The same for an interleaved stage's chunks together.
void require_chunks_memory(const std::vector<LayerInfo>& layers, const std::vector<LayerRange>& ranges,
                           double copies, int tensor_parts, int64_t batch_samples,
                           const std::string& who);

}  // namespace strata
