#include "strata/model.h"

#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string t; in >> t;) w.push_back(t);
  return w;
}

int int_arg(const std::string& spec, const std::string& w) {
  try {
    size_t used = 0;
    int v = std::stoi(w, &used);
    if (used == w.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  fail_input("model.layers: '{}': '{}' is not a positive integer", spec, w);
}

std::unique_ptr<Layer> parse_layer(const std::string& spec, const Shape& in, int index) {
  auto w = words(spec);
  if (w.empty()) fail_input("model.layers: empty layer spec");
  const std::string& k = w[0];
  auto nargs = [&](size_t lo, size_t hi) {
    if (w.size() - 1 < lo || w.size() - 1 > hi)
      fail_input("model.layers: '{}': {} takes {} to {} arguments", spec, k, lo, hi);
  };
  if (k == "linear") {
    nargs(1, 1);
    if (in.size() != 1)
      fail_input("model.layers: '{}' needs a flat input but gets {}; add \"flatten\" before it",
                 spec, shape_str(in));
    return make_linear(int(in[0]), int_arg(spec, w[1]));
  }
  if (k == "conv") {
    nargs(2, 4);
    if (in.size() != 3) fail_input("model.layers: '{}' needs a (C, H, W) input, gets {}", spec, shape_str(in));
    int stride = w.size() > 3 ? int_arg(spec, w[3]) : 1;
    int pad = 0;
    if (w.size() > 4) pad = w[4] == "0" ? 0 : int_arg(spec, w[4]);
    return make_conv2d(int(in[0]), int_arg(spec, w[1]), int_arg(spec, w[2]), stride, pad);
  }
  if (k == "maxpool") {
    nargs(1, 2);
    int kk = int_arg(spec, w[1]);
    return make_maxpool2d(kk, w.size() > 2 ? int_arg(spec, w[2]) : kk);
  }
  if (k == "relu") { nargs(0, 0); return make_relu(); }
  if (k == "gelu") { nargs(0, 0); return make_gelu(); }
  if (k == "flatten") { nargs(0, 0); return make_flatten(); }
  if (k == "dropout") {
    nargs(1, 1);
    float p = -1;
    try { p = std::stof(w[1]); } catch (const std::exception&) {}
    if (!(p >= 0 && p < 1)) fail_input("model.layers: '{}': p must be in [0, 1)", spec);
    return make_dropout(p, index);
  }
  fail_input("model.layers: '{}': unknown layer '{}' (linear, conv, maxpool, relu, gelu, "
             "flatten, dropout)", spec, k);
}

std::string short_kind(const std::string& spec) {
  auto w = words(spec);
  if (w.empty()) return "";
  const std::string& k = w[0];
  if (k == "linear") return "fc";
  return k;
}

}  // namespace

Model::Model(const ModelSpec& spec, Shape input_shape, int classes)
    : spec_(spec), input_shape_(std::move(input_shape)), classes_(classes) {
  Shape shape = input_shape_;
  std::map<std::string, int> counts;
  for (size_t i = 0; i < spec.size(); ++i) {
    // "relu, maxpool" runs as "maxpool, relu": max and ReLU commute exactly (ReLU is monotone,
    // so values, argmax and gradients are identical), and ReLU then touches 1/k^2 of the
    // elements: 12% of a CNN step before, 3% after.
    size_t at = i;
    if (i + 1 < spec.size() && short_kind(spec[i]) == "relu" && short_kind(spec[i + 1]) == "maxpool")
      at = i + 1;
    else if (i > 0 && short_kind(spec[i]) == "maxpool" && short_kind(spec[i - 1]) == "relu")
      at = i - 1;
    auto layer = parse_layer(spec[at], shape, int(at));
    std::string kind = short_kind(spec[at]);
    layer->name = fmt::format("{}{}", kind, ++counts[kind]);
    // "linear, relu" runs as one layer: bias and ReLU in the GEMM's epilogue, and one pass for
    // the ReLU's and the bias's gradients (same values; the ReLU's input is not stored).
    if (!layers_.empty())
      if (auto fused = fuse_linear_relu(layers_.back(), layer)) {  // same shape out
        layers_.back() = std::move(fused);
        continue;
      }
    if (!layers_.empty())
      if (auto fused = fuse_conv_pool(layers_.back(), layer)) {
        shape = fused->output_shape(shapes_.back());
        layers_.back() = std::move(fused);
        continue;
      }
    shapes_.push_back(shape);
    shape = layer->output_shape(shape);
    layers_.push_back(std::move(layer));
  }
  shapes_.push_back(shape);
  if (shape.size() != 1 || shape[0] != classes)
    fail_input("model: the last layer gives {} per sample; the data has {} classes (end the "
               "model with \"linear {}\")", shape_str(shape), classes, classes);

  // Flat layout in reverse layer order: backward finishes gradients front to back.
  int64_t total = 0;
  for (auto& l : layers_)
    for (auto& p : l->params) total += numel(p.shape);
  values_ = Tensor({total});
  grads_ = Tensor({total});
  int64_t off = 0;
  ready_after_.assign(layers_.size(), 0);
  for (size_t i = layers_.size(); i-- > 0;) {
    for (auto& p : layers_[i]->params) {
      p.name = layers_[i]->name + "." + p.name;
      p.offset = off;
      p.value = values_.data() + off;
      p.grad = grads_.data() + off;
      off += numel(p.shape);
    }
    ready_after_[i] = off;
  }
  for (auto& l : layers_)
    for (auto& p : l->params) params_.push_back(&p);
  outs_.resize(layers_.size());
  douts_.resize(layers_.size());
}

std::string Model::summary() const {
  std::string s;
  for (size_t i = 0; i < layers_.size(); ++i) {
    int64_t n = 0;
    for (auto& p : layers_[i]->params) n += numel(p.shape);
    s += fmt::format("  {:<8} {:<40} -> {:<16} {:>10}\n", layers_[i]->name, layers_[i]->describe(),
                     shape_str(shapes_[i + 1]), n ? fmt::format("{} params", n) : "");
  }
  return s + fmt::format("  total {} parameters, {:.2f} MFLOP per sample forward", values_.size(),
                         flops_per_sample() * 1e-6);
}

double Model::flops_per_sample() const {
  double f = 0;
  for (size_t i = 0; i < layers_.size(); ++i) f += layers_[i]->flops_per_sample(shapes_[i]);
  return f;
}

void Model::init(uint64_t seed) {
  for (Param* p : params_) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (unsigned char c : p->name) h = (h ^ c) * 1099511628211ull;
    Rng rng(hash_combine(seed, h));
    float bound = 1.0f / std::sqrt(float(p->fan_in));
    for (int64_t i = 0, n = numel(p->shape); i < n; ++i) p->value[i] = rng.uniform(-bound, bound);
  }
}

const Tensor& Model::forward(const Backend& be, const Tensor& x, const StepInfo& s) {
  input_ = &x;
  const int64_t b = x.dim(0);
  const Tensor* in = &x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Shape os = shapes_[i + 1];
    os.insert(os.begin(), b);
    if (layers_[i]->is_reshape()) {
      outs_[i] = Tensor::view(const_cast<float*>(in->data()), os);
    } else {
      outs_[i].resize(os);
      layers_[i]->forward(be, *in, outs_[i], s);
    }
    in = &outs_[i];
  }
  return *in;
}

void Model::backward(const Backend& be, const Tensor& dlogits,
                     const std::function<void(int64_t)>& on_ready) {
  STRATA_CHECK(input_, "backward before forward");
  const int64_t b = input_->dim(0);
  const Tensor* dy = &dlogits;
  // Below the lowest layer with parameters no gradient is needed: that layer skips its input
  // gradient (for the MLP, fc1's 64x784 product behind the flatten: a third of backward's
  // FLOPs) and the layers under it skip backward altogether, as autograd does for data.
  size_t lowest = layers_.size();
  for (size_t i = 0; i < layers_.size(); ++i)
    if (!layers_[i]->params.empty()) {
      lowest = i;
      break;
    }
  for (size_t i = layers_.size(); i-- > 0;) {
    if (i < lowest) {
      if (on_ready) on_ready(ready_after_[i]);
      continue;
    }
    const Tensor& x = i ? outs_[i - 1] : *input_;
    Tensor* dx = nullptr;
    if (i > lowest) {
      Shape is = shapes_[i];
      is.insert(is.begin(), b);
      if (layers_[i]->is_reshape()) douts_[i] = Tensor::view(const_cast<float*>(dy->data()), is);
      else douts_[i].resize(is);
      dx = &douts_[i];
    }
    if (!layers_[i]->is_reshape()) layers_[i]->backward(be, x, outs_[i], *dy, dx);
    if (on_ready) on_ready(ready_after_[i]);
    dy = dx;
  }
}

}  // namespace strata
