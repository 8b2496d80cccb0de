// A model, or a pipeline stage's share of one: its layers (the layer stack's, built from the
// description in config/model_spec.h, cut by the partition) and the passes over them; the
// parameters live in the flat layout (flat_layout.h), GPT-2's shared token table in the tied
// table (tied_table.h).
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_spec.h"
#include "model/flat_layout.h"
#include "model/layer_stack.h"
#include "model/layers.h"
#include "model/partition.h"
#include "model/tied_table.h"

namespace strata {

class Model {
 public:
  // The layers `stage` of the model `spec` (all of them by default). Parameter names, shapes
  // and initial values are those of the whole model, whatever the range. Throws UserError
  // naming the bad layer spec or shape mismatch (build_layers).
  Model(const ModelSpec& spec, Shape input_shape, int classes, LayerRange stage = {},
        TensorSplit tp = {});
  // A stage of an interleaved pipeline: several chunks (ranges in layer order, not adjacent).
  // Each forward and backward runs one chunk (StepInfo::chunk; backward that of the slot's
  // forward). The flat buffers hold the chunks' blocks in the whole model's order.
  Model(const ModelSpec& spec, Shape input_shape, int classes, std::vector<LayerRange> chunks,
        TensorSplit tp = {});
  const ModelSpec& spec() const { return spec_; }
  const Shape& input_shape() const { return input_shape_; }  // of the whole model
  // This stage: the per-sample shapes entering and leaving it (its first chunk's input, its
  // last chunk's output), and each chunk's.
  const Shape& stage_input_shape() const { return chunk_input_shape(0); }
  const Shape& stage_output_shape() const { return chunk_output_shape(chunks() - 1); }
  int chunks() const { return partition_.chunks(); }
  const Shape& chunk_input_shape(int c) const { return in_shapes_[size_t(partition_.begin(c))]; }
  const Shape& chunk_output_shape(int c) const { return out_shapes_[size_t(partition_.end(c) - 1)]; }
  // Which layers of the whole model this stage holds, and where their parameters sit in it.
  const Partition& partition() const { return partition_; }
  // This stage's parameters: flat buffers, packed and unsplit views, init and placement.
  FlatLayout& layout() { return layout_; }
  const FlatLayout& layout() const { return layout_; }
  // GPT-2's token table as this stage holds and shares it.
  const TiedTable& tied() const { return tied_; }
  int classes() const { return classes_; }
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  // The layout's, for the many readers (parameters in forward order; flat buffers).
  const std::vector<Param*>& params() const { return layout_.params(); }
  Tensor& values() { return layout_.values(); }
  Tensor& grads() { return layout_.grads(); }
  const Tensor& grads() const { return layout_.grads(); }
  Tensor& host_values() { return layout_.host_values(); }
  int64_t num_params() const { return layout_.num_params(); }
  void init(uint64_t seed) { layout_.init(seed); }
  void place(const Backend& be) { layout_.place(be); }
  void pull(const Backend& be) { layout_.pull(be); }
  void push(const Backend& be) { layout_.push(be); }

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
  // While set, forward and backward (B and W too) add each layer's wall time to
  // (*seconds)[layer] (for the measured pipeline partition, strata bench layers); nullptr stops it.
  void set_profile(std::vector<double>* seconds) { profile_ = seconds; }

 private:
  ModelSpec spec_;
  Shape input_shape_;
  int classes_;
  Partition partition_;
  TiedTable tied_;
  std::vector<std::unique_ptr<Layer>> layers_;  // this stage's
  std::vector<Shape> in_shapes_, out_shapes_;  // per sample, of layer i
  FlatLayout layout_;
  std::vector<size_t> lowest_;  // chunk c's lowest layer backward runs (the constructor's)
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
