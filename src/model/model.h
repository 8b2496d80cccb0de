// A model: a stack of layers built from its description (model_spec.h), with all parameters and gradients in two
// flat buffers (one allocation, one optimizer call, contiguous allreduce buckets).
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_spec.h"
#include "model/layers.h"

namespace strata {


// A pipeline stage's share of the model: layers [first, last) of the built layer list (after
// fusion, as the model summary prints them). last = -1: to the end.
struct LayerRange {
  int first = 0, last = -1;
};
// An interleaved pipeline's P stages hold P v virtual stages (ranges, in layer order): stage s
// the chunks s, s + P, ..., s + (v-1) P. Without interleaving (v = 1) one range each.
std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& virtual_ranges, int stages,
                                     int stage);

// One built layer of the whole model, for partitioning and reports (no buffers allocated).
struct LayerInfo {
  std::string name, describe;
  Shape in_shape, out_shape;  // per sample
  int64_t params = 0;
  int64_t flat = 0;  // floats its tensors span in the flat buffers (each padded: flat_span)
  double flops = 0;  // forward, per sample
  int64_t internal_bytes = 0;  // per sample, kept for backward besides the output (blocks)
  bool recomputes = false;     // recomputed in backward instead (train.recompute = block)
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

class Model {
 public:
  // The layers `stage` of the model `spec` (all of them by default). Parameter names, shapes
  // and initial values are those of the whole model, whatever the range. Throws UserError
  // naming the bad layer spec or shape mismatch.
  // tp: this rank's part of the tensor-parallel group (transformer blocks are split over it).
  Model(const ModelSpec& spec, Shape input_shape, int classes, LayerRange stage = {},
        TensorSplit tp = {});
  // A stage of an interleaved pipeline: several chunks (ranges in layer order, not adjacent).
  // Each forward and backward runs one chunk (StepInfo::chunk; backward that of the slot's
  // forward). The flat buffers hold the chunks' blocks in the whole model's order.
  Model(const ModelSpec& spec, Shape input_shape, int classes, std::vector<LayerRange> chunks,
        TensorSplit tp = {});
  // `where` names the spec's source in errors: "model.layers", or "FILE: attribute model_layers".
  static std::vector<LayerInfo> describe_layers(const ModelSpec& spec, const Shape& input_shape,
                                                int classes,
                                                const std::string& where = "model.layers");
  // Every parameter's global name ("fc1.weight") and whole shape, in layer order; nothing is
  // allocated (a file's tensors are checked against these before they are read).
  static std::vector<std::pair<std::string, Shape>> describe_params(
      const ModelSpec& spec, const Shape& input_shape, int classes,
      const std::string& where = "model.layers");

  const ModelSpec& spec() const { return spec_; }
  const Shape& input_shape() const { return input_shape_; }  // of the whole model
  // This stage: the per-sample shapes entering and leaving it (its first chunk's input, its
  // last chunk's output), and each chunk's.
  const Shape& stage_input_shape() const { return chunk_input_shape(0); }
  const Shape& stage_output_shape() const { return chunk_output_shape(chunks() - 1); }
  int chunks() const { return int(chunk_begin_.size()) - 1; }
  const Shape& chunk_input_shape(int c) const { return in_shapes_[size_t(chunk_begin_[size_t(c)])]; }
  const Shape& chunk_output_shape(int c) const { return out_shapes_[size_t(chunk_begin_[size_t(c) + 1] - 1)]; }
  // Where the stage's block sits in the whole model's flat buffers (later layers first;
  // offsets count whole tensors): per chunk, its offset in the stage's unsplit block (what
  // assemble writes and extract reads: the chunks' blocks one after the other), its offset in
  // the whole model, and its length.
  struct Segment {
    int64_t block_offset, whole_offset, count;
  };
  const std::vector<Segment>& whole_segments() const { return segments_; }
  int classes() const { return classes_; }
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  // Parameters in forward (layer) order.
  const std::vector<Param*>& params() const { return params_; }
  // The flat buffers the backend computes on (the optimizer, allreduce and layers use these).
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  // The host copy of values(): what checkpoints, parameter files and stage gathering read and
  // write. The same storage as values() until place() moves those to a device.
  Tensor& host_values() { return host_values_; }
  int64_t num_params() const { return values_.size(); }  // everything the optimizer updates

  // The stage's block of the whole model in the flat buffers: block_params() floats from 0
  // (this rank's parts of split parameters); whole_block_params() is its size unsplit, as
  // checkpoints hold it. After the block: the token table's copy, if any (tied_table()).
  int64_t block_params() const { return block_params_; }
  int64_t whole_block_params() const { return whole_block_params_; }
  // The unsplit block from every tensor rank's flat buffer (parts[t]: rank t's), and this
  // rank's part of an unsplit block.
  void assemble(const std::vector<const float*>& parts, float* whole) const;
  void extract(const float* whole, float* mine) const;
  // GPT-2's token table when the embedding and the LM head are on different pipeline stages:
  // the embedding's table on the first, the head's copy of it on the last, null elsewhere.
  // Their gradients are summed over the two stages before each update (both then take the
  // same update and stay equal).
  Param* tied_table() const;
  // The ranges of the flat buffers whose squares this rank adds to the global gradient norm,
  // each the pieces of one range of the packed layout: a parameter every tensor rank holds
  // whole is counted by rank 0, the table's copy not at all.
  std::vector<FlatPieces> norm_ranges() const;
  // The packed layout (tensors back to back, as they would lie unpadded): its size, the flat
  // index of packed index k (a boundary between tensors maps to the next one's start; the
  // size to num_params()), and packed shard sizes (zero_counts) as flat shard sizes.
  int64_t packed_params() const { return packed_params_; }
  int64_t flat_index(int64_t k) const;
  std::vector<int64_t> flat_counts(const std::vector<int64_t>& packed_counts) const;

  // Puts values and gradients in the backend's memory, uploading host_values(); a no-op for
  // host memory. Call after init or a resume, before training.
  void place(const Backend& be);
  // host_values() <- values() (before a checkpoint or parameter file), and the reverse.
  void pull(const Backend& be);
  void push(const Backend& be);
  std::string summary() const;  // multi-line table of layers, shapes and parameter counts
  double flops_per_sample() const;  // forward
  // Rows of logits per sample: 1 for a classifier, T for a language model (one per position).
  int64_t rows_per_sample() const { return numel(stage_output_shape()) / classes_; }
  // Throws UserError naming the layer and the op when `be` lacks an op a layer calls.
  void check_backend(const Backend& be) const;
  // int8 inference (strata quantize): the linear products that can run from int8 weights, and
  // the table of those that do (null: none). With a table, check_backend also asks for
  // linear_int8_forward.
  std::vector<Int8Target> int8_targets() const;
  void set_int8(Int8Table* table);
  Int8Table* int8() const { return int8_; }

  // PyTorch's default initialisation (uniform ±1/sqrt(fan_in) for weights and biases), each
  // tensor seeded by (seed, name): independent of rank count and layer order.
  void init(uint64_t seed);

  // Activation slots: each holds one forward's activations (and layer state) until its
  // backward. A pipeline stage uses one per micro-batch in flight (StepInfo::slot in forward,
  // the same number in backward); plain training only slot 0.
  int slots() const { return int(acts_.size()); }
  // Bytes of activations slot k holds now (outputs of every layer that owns its buffer).
  int64_t activation_bytes(int k) const;

  // x: (B, stage input shape...); must stay valid until the backward of slot s.slot. Returns
  // this stage's output (logits (B, classes) on the last), valid until the slot's next forward.
  const Tensor& forward(const Backend& be, const Tensor& x, const StepInfo& s);
  // Backward of slot `slot`'s forward, from the gradient at the stage's output (dlogits on
  // the last stage). Parameters
  // are laid out in reverse layer order, so the gradients finished so far are always a prefix
  // of grads(); after each layer, on_ready(prefix_len) is called so data parallelism can start
  // allreducing what is done. accumulate: add to grads() instead of overwriting (micro-batches
  // of one step). Returns the gradient at the stage's input for a stage after the first
  // (valid until the slot's next backward), else nullptr.
  const Tensor* backward(const Backend& be, const Tensor& dout, int slot,
                         const std::function<void(int64_t)>& on_ready = {}, bool accumulate = false);
  // Zero-bubble schedules: backward in two passes over the layers. backward_input (B) runs
  // each layer's input-gradient half and returns what backward returns; backward_weight (W),
  // later, the parameter-gradient halves from what B left in the slot (on_ready as in
  // backward). B then W write exactly what backward writes, bitwise (Layer::backward_input).
  const Tensor* backward_input(const Backend& be, const Tensor& dout, int slot, bool accumulate);
  void backward_weight(const Backend& be, int slot, const std::function<void(int64_t)>& on_ready,
                       bool accumulate);
  // While set, forward and backward add each layer's wall time to (*seconds)[layer] (for the
  // measured pipeline partition); nullptr stops it.
  void set_profile(std::vector<double>* seconds) { profile_ = seconds; }

 private:
  ModelSpec spec_;
  Shape input_shape_;
  int classes_;
  std::vector<int> chunk_begin_;  // chunk c: layers_[chunk_begin_[c], chunk_begin_[c+1])
  std::vector<bool> input_grad_;  // chunk c starts after the whole model's first layer
  std::vector<size_t> lowest_;    // chunk c's lowest layer backward runs (the constructor's)
  std::vector<Segment> segments_;
  TensorSplit tp_;
  int64_t block_params_ = 0, whole_block_params_ = 0, packed_params_ = 0;
  std::vector<const Param*> by_packed_;  // in packed (= flat) order
  std::unique_ptr<Param> tied_copy_;  // the token table's copy (the head's stage)
  Param* shared_table_ = nullptr;     // the table itself (the embedding's stage)
  std::vector<std::unique_ptr<Layer>> layers_;  // this stage's
  std::vector<Shape> in_shapes_, out_shapes_;  // per sample, of layer i
  std::vector<Param*> params_;
  std::vector<int64_t> ready_after_;  // grads prefix complete after layer i's backward
  Tensor values_, grads_, host_values_;
  struct Activations {
    const Tensor* input = nullptr;
    std::vector<Tensor> outs;   // outs[i]: output of layer i
    std::vector<Tensor> douts;  // douts[i]: gradient w.r.t. input of layer i
    const Tensor* dout = nullptr;  // the stage's output gradient, from B until W
    int chunk = 0;                 // whose forward the slot holds
  };
  enum class Pass { kWhole, kInput };
  const Tensor* run_backward(const Backend& be, const Tensor& dout, int slot,
                             const std::function<void(int64_t)>& on_ready, bool accumulate, Pass pass);
  size_t lowest_with_input_grad(size_t chunk) const;  // the first layer backward runs
  std::deque<Activations> acts_;  // per slot; a deque so views into a slot stay valid
  Activations& slot(int k);       // made on first use
  std::vector<double>* profile_ = nullptr;
  Int8Table* int8_ = nullptr;
};

}  // namespace strata
