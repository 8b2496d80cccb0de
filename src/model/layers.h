// Layers: thin, stateless-between-steps wrappers that call the backend's ops.
// The model keeps every layer's input and output; a layer keeps only what backward needs
// beyond them (argmax, dropout mask), one copy per activation slot: a pipeline stage has
// several micro-batches between forward and backward at once, each in its own slot, named by
// the caller (StepInfo::slot in forward, `slot` in backward).
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "model/int8.h"
#include "strata/backend.h"
#include "strata/rng.h"
#include "strata/tensor.h"

namespace strata {

class Comm;

// A parameter's value and gradient live in the model's flat buffers, in the backend's memory
// (value, grad: what the ops read and write); `host` is the value's host copy, the same
// pointer as `value` on the CPU (see Model::place).
// The flat buffers (values, gradients, optimizer state) start every tensor on a 256-byte
// boundary, as cuBLASLt's and cuDNN's fast kernels want their operands: a tensor of n floats
// spans flat_span(n). The padding holds zeros and keeps them (no op writes it, and the
// optimizers keep a zero parameter with a zero gradient at zero).
inline constexpr int64_t kFlatAlign = 64;  // floats
inline constexpr int64_t flat_span(int64_t n) { return (n + kFlatAlign - 1) / kFlatAlign * kFlatAlign; }

struct Param {
  std::string name;  // global name, e.g. "fc1.weight"
  Shape shape;
  int64_t fan_in = 1;  // for initialisation
  // How init() fills it: PyTorch's default uniform(±1/sqrt(fan_in)) (Linear, Conv2d), or
  // normal(0, std) (GPT-2's embeddings and linears), ones or zeros (LayerNorm).
  enum class Init { kUniformFanIn, kNormal, kOnes, kZeros } init = Init::kUniformFanIn;
  float std = 0.02f;
  float* value = nullptr;
  float* grad = nullptr;
  float* host = nullptr;
  int64_t offset = 0;  // into the flat buffers: a multiple of kFlatAlign (256 bytes)
  // Into the packed layout (every tensor of the flat buffers back to back, no padding): the
  // order the gradient norm sums in, and what ZeRO's shards split.
  int64_t packed = 0;
  // Tensor parallelism: this rank may hold one part of the whole tensor (whole_shape), cut
  // along dim 0 (split_dim 0: `split_groups` equal blocks of rows, each cut in parts: c_attn's
  // q, k and v rows each split by heads) or along dim 1 (split_dim 1: columns). -1: whole.
  Shape whole_shape = {};  // = shape unless split (Model fills it)
  int split_dim = -1;
  int split_groups = 1;
  int64_t whole_offset = 0;  // into the stage's unsplit block (checkpoint layout)
  // Rows in use, when fewer than shape[0] (0 = all): the rows after them are padding (the
  // token table's, model.pad_vocab), zero from init on: no op reads them or writes their
  // gradient, so every optimizer keeps them at zero.
  int64_t used_rows = 0;
};

// Megatron-style tensor parallelism: a transformer block's attention heads and MLP hidden
// units divided over `size` ranks, this one being `rank`; `comm` joins them (host memory).
struct TensorSplit {
  int rank = 0, size = 1;
  Comm* comm = nullptr;
};

// Per-step facts some layers need (dropout keys its mask on them), and the activation slot
// whose state a forward keeps for its backward.
struct StepInfo {
  bool training = true;
  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t first_sample = 0;  // this rank's first position within the global batch
  int slot = 0;              // a pipeline stage has a slot per micro-batch in flight
  int chunk = 0;             // which of the stage's chunks runs (interleaved pipelines)
};

class Layer {
 public:
  virtual ~Layer() = default;
  std::string name;               // "fc1", "conv2", "relu3"
  std::vector<Param> params;      // filled by the constructor (shapes); bound by the model
  virtual std::string describe() const = 0;  // "Linear(784 -> 256)"
  // The backend ops forward and backward call (a model checks them with Backend::supports).
  virtual std::vector<Op> ops() const = 0;
  // Shape of one sample's output given one sample's input shape (without the batch dim).
  virtual Shape output_shape(const Shape& in) const = 0;
  // x: (B, in...), y: (B, out...) already sized by the model. State backward needs is kept
  // in activation slot s.slot.
  virtual void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& s) = 0;
  // dx may be null (first layer). Writes param grads, or adds to them when `accumulate`.
  // `slot`: the slot of the forward this backward belongs to.
  virtual void backward(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                        Tensor* dx, int slot, bool accumulate) = 0;
  // Zero-bubble schedules split backward in two: backward_input (B) writes only dx, which the
  // stage below waits for; backward_weight (W), called later for the same slot with the same
  // x, y and dy, only the parameter gradients, which nothing waits for. B then W write exactly
  // what backward writes, bitwise (the same kernels on the same operands). A layer that does
  // not split (splits_backward() false: no parameters, or state backward cannot keep until W)
  // does all of backward in B, and W is a no-op.
  virtual bool splits_backward() const { return false; }
  virtual void backward_input(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                              Tensor* dx, int slot, bool accumulate) {
    backward(be, x, y, dy, dx, slot, accumulate);
  }
  virtual void backward_weight(const Backend& be, const Tensor& x, const Tensor& y,
                               const Tensor& dy, int slot, bool accumulate) {}
  // True for layers that only reshape (Flatten): the model then passes views instead of
  // calling forward/backward, so no bytes are copied.
  virtual bool is_reshape() const { return false; }
  // Model FLOPs of forward for one sample (for reports); backward is about twice this.
  virtual double flops_per_sample(const Shape& in) const { return 0; }
  // Bytes per sample a transformer block keeps from forward for backward besides its output
  // (its internal activations), and whether it recomputes them instead (train.recompute):
  // for reports of what recomputation saves.
  virtual int64_t internal_bytes_per_sample(const Shape& in) const { return 0; }
  virtual bool recomputes() const { return false; }
  // int8 inference: the linear products this layer can run from int8 weights (strata quantize
  // quantizes them), and the model's table of those it has; forward uses them when set.
  virtual std::vector<Int8Target> int8_targets() const { return {}; }
  Int8Table* int8 = nullptr;
};

// A layer whose backward is one kernel call (or a few) that writes the input gradient and the
// parameter gradients, skipping those passed null: B and W are that call with the other half's
// outputs null, so together they write the whole backward's bits.
class SplitLayer : public Layer {
 public:
  bool splits_backward() const override { return true; }
  void backward(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                Tensor* dx, int slot, bool accumulate) override {
    grads(be, x, y, dy, dx, slot, true, accumulate);
  }
  void backward_input(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                      Tensor* dx, int slot, bool accumulate) override {
    if (dx) grads(be, x, y, dy, dx, slot, false, accumulate);
  }
  void backward_weight(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                       int slot, bool accumulate) override {
    grads(be, x, y, dy, nullptr, slot, true, accumulate);
  }

 protected:
  // dx if not null; the parameter gradients if `param_grads`.
  virtual void grads(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy,
                     Tensor* dx, int slot, bool param_grads, bool accumulate) = 0;
};

// State a layer keeps from forward for backward, one per activation slot. A deque: growing it
// never moves the states already there.
template <class T>
class PerSlot {
 public:
  T& operator[](int k) {
    if (size_t(k) >= v_.size()) v_.resize(size_t(k) + 1);
    return v_[size_t(k)];
  }

 private:
  std::deque<T> v_;
};

std::unique_ptr<Layer> make_linear(int in, int out);
std::unique_ptr<Layer> make_conv2d(int in_ch, int out_ch, int kernel, int stride, int pad);
std::unique_ptr<Layer> make_maxpool2d(int kernel, int stride);
std::unique_ptr<Layer> make_relu();
std::unique_ptr<Layer> make_gelu();
std::unique_ptr<Layer> make_silu();
std::unique_ptr<Layer> make_flatten();
std::unique_ptr<Layer> make_dropout(float p, int index);  // index decorrelates masks

// GPT-2 (layers_gpt.cpp). Per sample, activations are (T, C): T positions of C features.
// Token ids (T) as floats -> token + position embedding (T, C). row_multiple > 1: the token
// table has `vocab` rounded up to a multiple of it rows (llm.c's padding of GPT-2's 50257 to
// 50304); ids stay in [0, vocab) and the rows after them are never read.
std::unique_ptr<Layer> make_embedding(int vocab, int dim, int context, int row_multiple = 0);
// The token table's rows for `vocab` and a row multiple (0 or 1: vocab itself).
int64_t padded_vocab(int64_t vocab, int row_multiple);
// One pre-LayerNorm transformer block (T, C) -> (T, C): x + attn(ln_1(x)), then
// + mlp(ln_2(.)) with a 4C GELU MLP (erf GELU, or GPT-2's tanh form with gelu_tanh); dropout p on both residual branches. `blocks` (the model's
// count) scales the init of the residual projections as GPT-2 does; `recompute` keeps only the
// block's input from forward and recomputes the rest in backward. Under tensor parallelism
// (tp.size > 1) the block holds heads/size heads and 4*dim/size MLP units: c_attn and c_fc
// column-parallel, both c_proj row-parallel, one allreduce over tp.comm per branch in forward
// (the row-parallel output) and one in backward (the gradient at the branch's LayerNorm).
std::unique_ptr<Layer> make_block(int dim, int heads, int blocks, float dropout, int index,
                                  bool recompute, bool gelu_tanh = false, TensorSplit tp = {});
std::unique_ptr<Layer> make_layernorm(int dim);
// Logits (T, V) = x (T, C) @ wte^T: the output layer, tied to the embedding's token table
// (tie_lm_head connects them once both exist; Model does it). With a padded table it reads
// the first V rows: the padded rows have no logits, so the loss, its gradient and sampling
// never see them.
std::unique_ptr<Layer> make_lm_head(int vocab);
// Ties head to embedding; false if they are not an LM head and an embedding.
bool tie_lm_head(Layer& head, Layer& embedding);
// Ties head to a copy of the token table (a pipeline whose last stage holds the head and the
// first the embedding: the copy's gradient is summed with the table's each step, so the two
// stay equal); false if head is not an LM head.
bool tie_lm_head(Layer& head, Param& table);
// The embedding's token table (its gradient is shared with the head); null for other layers.
Param* token_table(Layer& embedding);
bool is_lm_head(const Layer& layer);
// Conv2d immediately followed by MaxPool2d as one layer that pools each chunk of samples while
// its convolution output is in cache. Takes both (the conv's name and parameters are kept);
// returns null, leaving them untouched, if they are not a Conv2d and a MaxPool2d.
std::unique_ptr<Layer> fuse_conv_pool(std::unique_ptr<Layer>& conv, std::unique_ptr<Layer>& pool);
// Linear immediately followed by ReLU as one layer (bias and ReLU in the GEMM's epilogue on
// the CPU). Same contract as fuse_conv_pool: null, leaving both untouched, if they are not a
// Linear and a ReLU.
std::unique_ptr<Layer> fuse_linear_relu(std::unique_ptr<Layer>& linear, std::unique_ptr<Layer>& relu);
// A ReLU after a fused Conv2d + MaxPool2d joins it (run on each pooled chunk in cache): true,
// and conv_pool then does both; false, leaving both untouched, if they are not that pair.
bool fuse_conv_pool_relu(std::unique_ptr<Layer>& conv_pool, const std::unique_ptr<Layer>& relu);

}  // namespace strata
