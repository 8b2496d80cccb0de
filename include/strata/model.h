// A model: a stack of layers built from a text spec, with all parameters and gradients in two
// flat buffers (one allocation, one optimizer call, contiguous allreduce buckets).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/layers.h"

namespace strata {

// One layer per string: "linear OUT", "conv OUT_CH KERNEL [STRIDE [PAD]]", "maxpool K [STRIDE]",
// "relu", "gelu", "flatten", "dropout P". Input sizes are inferred.
using ModelSpec = std::vector<std::string>;

class Model {
 public:
  // Throws UserError naming the bad layer spec or shape mismatch.
  Model(const ModelSpec& spec, Shape input_shape, int classes);

  const ModelSpec& spec() const { return spec_; }
  const Shape& input_shape() const { return input_shape_; }
  int classes() const { return classes_; }
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  // Parameters in forward (layer) order.
  const std::vector<Param*>& params() const { return params_; }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  int64_t num_params() const { return values_.size(); }
  std::string summary() const;  // multi-line table of layers, shapes and parameter counts
  double flops_per_sample() const;  // forward

  // PyTorch's default initialisation (uniform ±1/sqrt(fan_in) for weights and biases), each
  // tensor seeded by (seed, name): independent of rank count and layer order.
  void init(uint64_t seed);

  // x: (B, input_shape...). Returns logits (B, classes), valid until the next forward.
  const Tensor& forward(const Backend& be, const Tensor& x, const StepInfo& s);
  // Backward from dlogits. Parameters are laid out in reverse layer order, so the gradients
  // finished so far are always a prefix of grads(); after each layer, on_ready(prefix_len) is
  // called so data parallelism can start allreducing what is done.
  void backward(const Backend& be, const Tensor& dlogits,
                const std::function<void(int64_t)>& on_ready = {});

 private:
  ModelSpec spec_;
  Shape input_shape_;
  int classes_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> shapes_;  // per-sample shape entering layer i; shapes_.back() = output
  std::vector<Param*> params_;
  std::vector<int64_t> ready_after_;  // grads prefix complete after layer i's backward
  Tensor values_, grads_;
  const Tensor* input_ = nullptr;
  std::vector<Tensor> outs_;   // outs_[i]: output of layer i
  std::vector<Tensor> douts_;  // douts_[i]: gradient w.r.t. input of layer i (unused for i = 0)
};

}  // namespace strata
