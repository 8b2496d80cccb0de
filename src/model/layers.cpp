#include "model/layers.h"

#include <algorithm>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

int batch_of(const Tensor& t) { return int(t.dim(0)); }

class Linear final : public SplitLayer {
 public:
  Linear(int in, int out) : in_(in), out_(out) {
    params = {{.name = "weight", .shape = {out, in}, .fan_in = in},
              {.name = "bias", .shape = {out}, .fan_in = in}};
  }
  std::vector<Op> ops() const override {
    return {Op::linear_forward, Op::linear_backward};
  }
  std::string describe() const override { return fmt::format("Linear({} -> {})", in_, out_); }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 1 || in[0] != in_)
      fail_input("model: {} expects {} input features per sample, got shape {}", describe(), in_,
                 shape_str(in));
    return {out_};
  }
  // y (B,O) = x (B,I) W^T + b
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    if (!int8_linear(int8, params[0].name, be, y.data(), x.data(), params[1].value, batch_of(x),
                     in_, out_, false))
      be.linear_forward(y.data(), x.data(), params[0].value, params[1].value, batch_of(x), in_, out_);
  }
  std::vector<Int8Target> int8_targets() const override {
    return {{params[0].name, params[0].name, out_, in_}};
  }
  double flops_per_sample(const Shape&) const override { return 2.0 * in_ * out_; }

 private:
  void grads(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, int,
             bool param_grads, bool accumulate) override {
    be.linear_backward(dx ? dx->data() : nullptr, param_grads ? params[0].grad : nullptr,
                       param_grads ? params[1].grad : nullptr, dy.data(), x.data(),
                       params[0].value, batch_of(x), in_, out_, accumulate);
  }
  int in_, out_;
};

class Conv2d final : public SplitLayer {
 public:
  Conv2d(int c, int oc, int k, int stride, int pad) : c_(c), oc_(oc), k_(k), stride_(stride), pad_(pad) {
    params = {{.name = "weight", .shape = {oc, c, k, k}, .fan_in = c * k * k},
              {.name = "bias", .shape = {oc}, .fan_in = c * k * k}};
  }
  std::vector<Op> ops() const override {
    return {Op::conv2d_scratch_size, Op::conv2d_forward, Op::conv2d_backward};
  }
  std::string describe() const override {
    return fmt::format("Conv2d({} -> {}, {}x{}, stride {}, pad {})", c_, oc_, k_, k_, stride_, pad_);
  }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 3 || in[0] != c_)
      fail_input("model: {} expects input (C={}, H, W) per sample, got shape {}", describe(), c_,
                 shape_str(in));
    auto s = conv_shape(1, in);
    if (s.OH() <= 0 || s.OW() <= 0)
      fail_input("model: {} does not fit a {}x{} input", describe(), in[1], in[2]);
    return {oc_, s.OH(), s.OW()};
  }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    auto s = conv_shape(batch_of(x), {x.dim(1), x.dim(2), x.dim(3)});
    scratch_.resize({be.conv2d_scratch_size(s)}, *be.memory);
    if (!int8_conv(int8, params[0].name, be, y.data(), x.data(), params[1].value, s,
                   scratch_.data()))
      be.conv2d_forward(y.data(), x.data(), params[0].value, params[1].value, s, scratch_.data());
  }
  std::vector<Int8Target> int8_targets() const override {
    return {{params[0].name, params[0].name, oc_, c_ * k_ * k_}};
  }
  void grads(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, int,
             bool param_grads, bool accumulate) override {
    auto s = conv_shape(batch_of(x), {x.dim(1), x.dim(2), x.dim(3)});
    scratch_.resize({be.conv2d_scratch_size(s)}, *be.memory);
    be.conv2d_backward(dx ? dx->data() : nullptr, param_grads ? params[0].grad : nullptr,
                       param_grads ? params[1].grad : nullptr, dy.data(), x.data(),
                       params[0].value, s, scratch_.data(), accumulate);
  }
  double flops_per_sample(const Shape& in) const override {
    auto s = conv_shape(1, in);
    return 2.0 * oc_ * s.OH() * s.OW() * c_ * k_ * k_;
  }
  Conv2dShape conv_shape(int b, const Shape& in) const {
    return {.B = b, .C = int(in[0]), .H = int(in[1]), .W = int(in[2]), .OC = oc_, .KH = k_,
            .KW = k_, .stride = stride_, .pad = pad_};
  }

 private:
  int c_, oc_, k_, stride_, pad_;
  Tensor scratch_;  // workspace only: backward redoes the im2col
};

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(int k, int st) : k_(k), st_(st) {}
  std::vector<Op> ops() const override {
    return {Op::maxpool2d_forward, Op::maxpool2d_backward};
  }
  std::string describe() const override { return fmt::format("MaxPool2d({}, stride {})", k_, st_); }
  Shape output_shape(const Shape& in) const override {
    if (in.size() != 3 || in[1] < k_ || in[2] < k_)
      fail_input("model: {} needs a (C, H, W) input of at least {}x{}, got {}", describe(), k_, k_,
                 shape_str(in));
    return {in[0], (in[1] - k_) / st_ + 1, (in[2] - k_) / st_ + 1};
  }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    auto& argmax = argmax_[si.slot];
    argmax.resize(y.shape, *be.memory);
    be.maxpool2d_forward(y.data(), argmax.i32(), x.data(), batch_of(x), int(x.dim(1)),
                         int(x.dim(2)), int(x.dim(3)), k_, st_);
  }
  void backward(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx, int slot, bool) override {
    if (!dx) return;
    be.maxpool2d_backward(dx->data(), dy.data(), argmax_[slot].i32(), batch_of(x), int(x.dim(1)),
                          int(x.dim(2)), int(x.dim(3)), k_, st_);
  }
  int k_, st_;

 private:
  PerSlot<Tensor> argmax_;  // int32 (Tensor::i32)
};

class Relu final : public Layer {
 public:
  std::vector<Op> ops() const override {
    return {Op::relu_forward, Op::relu_backward};
  }
  std::string describe() const override { return "ReLU"; }
  Shape output_shape(const Shape& in) const override { return in; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    be.relu_forward(y.data(), x.data(), x.size());
  }
  void backward(const Backend& be, const Tensor&, const Tensor& y, const Tensor& dy,
                Tensor* dx, int, bool) override {
    if (dx) be.relu_backward(dx->data(), dy.data(), y.data(), y.size());
  }
};

class Gelu final : public Layer {
 public:
  std::vector<Op> ops() const override {
    return {Op::gelu_forward, Op::gelu_backward};
  }
  std::string describe() const override { return "GELU"; }
  Shape output_shape(const Shape& in) const override { return in; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    be.gelu_forward(y.data(), x.data(), x.size());
  }
  void backward(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx, int, bool) override {
    if (dx) be.gelu_backward(dx->data(), dy.data(), x.data(), x.size());
  }
};

// Flatten: row-major (B, C, H, W) already is (B, C*H*W), so the model aliases the buffers
// (is_reshape); forward/backward copy only when called on separate buffers.
class Silu final : public Layer {
 public:
  std::vector<Op> ops() const override { return {Op::silu_forward, Op::silu_backward}; }
  std::string describe() const override { return "SiLU"; }
  Shape output_shape(const Shape& in) const override { return in; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo&) override {
    be.silu_forward(y.data(), x.data(), x.size());
  }
  void backward(const Backend& be, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx, int, bool) override {
    if (dx) be.silu_backward(dx->data(), dy.data(), x.data(), x.size());
  }
};

class Flatten final : public Layer {
 public:
  std::vector<Op> ops() const override { return {}; }
  std::string describe() const override { return "Flatten"; }
  Shape output_shape(const Shape& in) const override { return {numel(in)}; }
  bool is_reshape() const override { return true; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    be.copy(y.data(), x.data(), sizeof(float) * size_t(x.size()));
  }
  void backward(const Backend& be, const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx,
                int, bool) override {
    if (dx) be.copy(dx->data(), dy.data(), sizeof(float) * size_t(dy.size()));
  }
};

class Dropout final : public Layer {
 public:
  Dropout(float p, int index) : p_(p), index_(index) {}
  std::vector<Op> ops() const override {
    return {Op::dropout_forward, Op::dropout_backward};
  }
  std::string describe() const override { return fmt::format("Dropout(p={})", p_); }
  Shape output_shape(const Shape& in) const override { return in; }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& s) override {
    if (!s.training || p_ == 0.0f) {
      be.copy(y.data(), x.data(), sizeof(float) * size_t(x.size()));
      active_[s.slot] = false;
      return;
    }
    active_[s.slot] = true;
    Tensor& mask = mask_[s.slot];
    mask.resize(x.shape, *be.memory);
    int b = batch_of(x);
    be.dropout_forward(y.data(), mask.data(), x.data(), b, b ? x.size() / b : 0, p_,
                       hash_combine(s.seed, uint64_t(index_) + 0xD50D), s.step, s.first_sample);
  }
  void backward(const Backend& be, const Tensor&, const Tensor&, const Tensor& dy,
                Tensor* dx, int slot, bool) override {
    if (!dx) return;
    if (!active_[slot]) be.copy(dx->data(), dy.data(), sizeof(float) * size_t(dy.size()));
    else be.dropout_backward(dx->data(), dy.data(), mask_[slot].data(), dy.size());
  }

 private:
  float p_;
  int index_;
  PerSlot<bool> active_;
  PerSlot<Tensor> mask_;
};

// Conv2d followed by MaxPool2d, run a few samples at a time: each chunk's convolution output
// is pooled while it is still in cache (about 256 KiB per chunk) and never stored whole.
// Unfused, the pooling pass re-read a 6 MB conv1 output per batch from memory: 13% (forward)
// and 5% (backward) of a CNN step. Values are those of the two layers; the weight gradient is
// summed chunk by chunk (a different, still fixed, summation order). A ReLU after the pooling
// (fuse_conv_pool_relu) runs on each pooled chunk in cache, and its backward gates the chunk's
// gradient there: as a layer of its own it passed over the whole batch's activations twice,
// 3.1 % of the CNN's step on Zen 5. The same values.
class ConvPool final : public SplitLayer {
 public:
  ConvPool(std::unique_ptr<Conv2d> conv, int k, int st) : conv_(std::move(conv)), k_(k), st_(st) {
    params = std::move(conv_->params);
  }
  std::vector<Op> ops() const override {
    return {Op::conv2d_scratch_size, Op::conv2d_forward, Op::conv2d_backward,
            Op::maxpool2d_forward, Op::maxpool2d_backward, Op::add_inplace,
            Op::relu_forward, Op::relu_backward};
  }
  std::string describe() const override {
    return fmt::format("{} + MaxPool2d({}, stride {}){}", conv_->describe(), k_, st_,
                       relu_ ? " + ReLU" : "");
  }
  void add_relu() { relu_ = true; }
  Shape output_shape(const Shape& in) const override {
    Shape c = conv_->output_shape(in);
    if (c[1] < k_ || c[2] < k_)
      fail_input("model: MaxPool2d({}) needs at least {}x{}, gets {}", k_, k_, k_, shape_str(c));
    return {c[0], (c[1] - k_) / st_ + 1, (c[2] - k_) / st_ + 1};
  }
  double flops_per_sample(const Shape& in) const override { return conv_->flops_per_sample(in); }
  std::vector<Int8Target> int8_targets() const override {
    const Shape& w = params[0].shape;
    return {{params[0].name, params[0].name, int(w[0]), int(w[1] * w[2] * w[3])}};
  }

  // x (B,C,H,W) -> y (B,OC,PH,PW)
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    const Geometry g = geometry(be, x);
    auto& argmax = argmax_[si.slot];
    argmax.resize(y.shape, *be.memory);
    for (int b0 = 0; b0 < g.B; b0 += g.nb) {
      const int nb = std::min(g.nb, g.B - b0);
      auto s = g.conv;
      s.B = nb;
      if (!int8_conv(int8, params[0].name, be, conv_out_.data(), x.data() + int64_t(b0) * g.in,
                     params[1].value, s, scratch_.data()))
        be.conv2d_forward(conv_out_.data(), x.data() + int64_t(b0) * g.in, params[0].value,
                          params[1].value, s, scratch_.data());
      float* yc = y.data() + int64_t(b0) * g.out;
      be.maxpool2d_forward(yc, argmax.i32() + int64_t(b0) * g.out, conv_out_.data(), nb, s.OC,
                           s.OH(), s.OW(), k_, st_);
      if (relu_) be.relu_forward(yc, yc, nb * g.out);
    }
  }
 private:
  // Per chunk: the pooling's backward into the chunk's conv output gradient, then dx (if not
  // null) and the parameter gradients (if param_grads). B and W each redo the pooling's
  // backward (a copy by argmax), so neither keeps it.
  void grads(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
             int slot, bool param_grads, bool accumulate) override {
    const Geometry g = geometry(be, x);
    const int64_t nw = numel(params[0].shape), nbias = numel(params[1].shape);
    dw_.resize({nw + nbias}, *be.memory);
    if (relu_) dpool_.resize({g.nb * g.out}, *be.memory);
    for (int b0 = 0; b0 < g.B; b0 += g.nb) {
      const int nb = std::min(g.nb, g.B - b0);
      auto s = g.conv;
      s.B = nb;
      const float* dyc = dy.data() + int64_t(b0) * g.out;
      if (relu_) {  // the ReLU's gradient at the pooled chunk: dy where the output is positive
        be.relu_backward(dpool_.data(), dyc, y.data() + int64_t(b0) * g.out, nb * g.out);
        dyc = dpool_.data();
      }
      be.maxpool2d_backward(conv_out_.data(), dyc, argmax_[slot].i32() + int64_t(b0) * g.out, nb,
                            s.OC, s.OH(), s.OW(), k_, st_);
      // The first chunk writes the gradient (unless accumulating); the others add to it.
      const bool writes = b0 == 0 && !accumulate;
      float* gw = !param_grads ? nullptr : writes ? params[0].grad : dw_.data();
      float* gb = !param_grads ? nullptr : writes ? params[1].grad : dw_.data() + nw;
      be.conv2d_backward(dx ? dx->data() + int64_t(b0) * g.in : nullptr, gw, gb, conv_out_.data(),
                         x.data() + int64_t(b0) * g.in, params[0].value, s, scratch_.data(), false);
      if (param_grads && !writes) {
        be.add_inplace(params[0].grad, dw_.data(), nw);
        be.add_inplace(params[1].grad, dw_.data() + nw, nbias);
      }
    }
  }
  // Output bytes convolved per chunk before pooling: on a CPU an L2-sized chunk stays in
  // cache; a GPU wants the whole batch in one call.
  static int64_t chunk_bytes(const Backend& be) {
    return be.processor == Processor::cpu ? int64_t(256) << 10 : int64_t(1) << 40;
  }
  struct Geometry {
    Conv2dShape conv;
    int B, nb;
    int64_t in, out;  // floats per sample of x and y
  };
  Geometry geometry(const Backend& be, const Tensor& x) {
    Geometry g;
    g.B = batch_of(x);
    g.conv = conv_->conv_shape(g.B, {x.dim(1), x.dim(2), x.dim(3)});
    const int64_t conv_per_sample = int64_t(g.conv.OC) * g.conv.OH() * g.conv.OW();
    g.nb = int(std::clamp<int64_t>(chunk_bytes(be) / (4 * conv_per_sample), 1, std::max(g.B, 1)));
    g.in = x.size() / std::max(g.B, 1);
    g.out = int64_t(g.conv.OC) * ((g.conv.OH() - k_) / st_ + 1) * ((g.conv.OW() - k_) / st_ + 1);
    auto chunk = g.conv;
    chunk.B = g.nb;
    conv_out_.resize({g.nb * conv_per_sample}, *be.memory);
    scratch_.resize({std::max<int64_t>(1, be.conv2d_scratch_size(chunk))}, *be.memory);
    return g;
  }
  std::unique_ptr<Conv2d> conv_;
  int k_, st_;
  bool relu_ = false;
  Tensor conv_out_, scratch_, dw_, dpool_;  // workspaces
  PerSlot<Tensor> argmax_;  // int32 (Tensor::i32)
};

// Linear followed by ReLU as one layer. On the CPU backend the bias and the ReLU run in the
// GEMM's epilogue (no passes of their own over the activations), and backward turns the
// ReLU's gradient and the bias gradient out of one pass; the values are the two layers'. The
// ReLU's input is never stored. A backend without a fused kernel points these entries at a
// function that runs its two ops one after the other.
class LinearRelu final : public SplitLayer {
 public:
  LinearRelu(std::unique_ptr<Linear> lin) : lin_(std::move(lin)) {
    params = std::move(lin_->params);
  }
  std::vector<Op> ops() const override {
    return {Op::linear_relu_forward, Op::linear_relu_backward};
  }
  std::string describe() const override { return lin_->describe() + " + ReLU"; }
  Shape output_shape(const Shape& in) const override { return lin_->output_shape(in); }
  double flops_per_sample(const Shape& in) const override { return lin_->flops_per_sample(in); }
  void forward(const Backend& be, const Tensor& x, Tensor& y, const StepInfo& si) override {
    const int B = batch_of(x), I = int(x.size() / std::max(B, 1)), O = int(y.size() / std::max(B, 1));
    if (!int8_linear(int8, params[0].name, be, y.data(), x.data(), params[1].value, B, I, O, true))
      be.linear_relu_forward(y.data(), x.data(), params[0].value, params[1].value, B, I, O);
  }
  std::vector<Int8Target> int8_targets() const override {
    const Shape& w = params[0].shape;
    return {{params[0].name, params[0].name, int(w[0]), int(w[1])}};
  }

 private:
  // B and W each recompute the ReLU's mask of dy (one pass), so neither keeps it.
  void grads(const Backend& be, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx, int,
             bool param_grads, bool accumulate) override {
    const int B = batch_of(x), I = int(x.size() / std::max(B, 1)), O = int(y.size() / std::max(B, 1));
    dpre_.resize(y.shape, *be.memory);
    be.linear_relu_backward(dx ? dx->data() : nullptr, param_grads ? params[0].grad : nullptr,
                            param_grads ? params[1].grad : nullptr, dy.data(), y.data(), x.data(),
                            params[0].value, B, I, O, dpre_.data(), accumulate);
  }
  std::unique_ptr<Linear> lin_;
  Tensor dpre_;  // workspace
};

}  // namespace

std::unique_ptr<Layer> fuse_linear_relu(std::unique_ptr<Layer>& linear, std::unique_ptr<Layer>& relu) {
  auto* l = dynamic_cast<Linear*>(linear.get());
  if (!l || !dynamic_cast<Relu*>(relu.get())) return nullptr;
  const std::string name = l->name;  // the fused layer keeps the linear's name and parameters
  std::unique_ptr<Linear> owned(static_cast<Linear*>(linear.release()));
  auto fused = std::make_unique<LinearRelu>(std::move(owned));
  fused->name = name;
  return fused;
}

std::unique_ptr<Layer> fuse_conv_pool(std::unique_ptr<Layer>& conv, std::unique_ptr<Layer>& pool) {
  auto* c = dynamic_cast<Conv2d*>(conv.get());
  auto* p = dynamic_cast<MaxPool2d*>(pool.get());
  if (!c || !p) return nullptr;
  const std::string name = c->name;  // the fused layer keeps the conv's name and parameters
  std::unique_ptr<Conv2d> owned(static_cast<Conv2d*>(conv.release()));
  auto fused = std::make_unique<ConvPool>(std::move(owned), p->k_, p->st_);
  fused->name = name;
  return fused;
}

bool fuse_conv_pool_relu(std::unique_ptr<Layer>& conv_pool, const std::unique_ptr<Layer>& relu) {
  auto* c = dynamic_cast<ConvPool*>(conv_pool.get());
  if (!c || !dynamic_cast<Relu*>(relu.get())) return false;
  c->add_relu();
  return true;
}

std::unique_ptr<Layer> make_linear(int in, int out) { return std::make_unique<Linear>(in, out); }
std::unique_ptr<Layer> make_conv2d(int c, int oc, int k, int stride, int pad) {
  return std::make_unique<Conv2d>(c, oc, k, stride, pad);
}
std::unique_ptr<Layer> make_maxpool2d(int k, int st) { return std::make_unique<MaxPool2d>(k, st); }
std::unique_ptr<Layer> make_relu() { return std::make_unique<Relu>(); }
std::unique_ptr<Layer> make_gelu() { return std::make_unique<Gelu>(); }
std::unique_ptr<Layer> make_silu() { return std::make_unique<Silu>(); }
std::unique_ptr<Layer> make_flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> make_dropout(float p, int index) { return std::make_unique<Dropout>(p, index); }

}  // namespace strata
