#include "strata/model.h"

#include <algorithm>
#include <chrono>
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

// The model-wide facts some layers need: the class (vocabulary) count and the number of
// transformer blocks (GPT-2 scales its residual projections' init by it).
struct BuildContext {
  int classes = 0;
  int blocks = 0;
};

std::unique_ptr<Layer> parse_layer(const std::string& spec, const Shape& in, int index,
                                   const BuildContext& ctx) {
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
  auto prob = [&](const std::string& v) {
    float p = -1;
    try { p = std::stof(v); } catch (const std::exception&) {}
    if (!(p >= 0 && p < 1)) fail_input("model.layers: '{}': p must be in [0, 1)", spec);
    return p;
  };
  if (k == "dropout") {
    nargs(1, 1);
    return make_dropout(prob(w[1]), index);
  }
  // GPT-2: "embedding DIM", "block HEADS [DROPOUT [recompute]]", "layernorm", "lmhead".
  if (k == "embedding") {
    nargs(1, 1);
    if (in.size() != 1)
      fail_input("model.layers: '{}' needs token ids (T) per sample, gets {}", spec, shape_str(in));
    return make_embedding(ctx.classes, int_arg(spec, w[1]), int(in[0]));
  }
  if (k == "block") {
    nargs(1, 3);
    if (in.size() != 2) fail_input("model.layers: '{}' needs (T, C) per sample, gets {}", spec, shape_str(in));
    const int heads = int_arg(spec, w[1]), C = int(in[1]);
    if (C % heads != 0)
      fail_input("model.heads = {} does not divide model.dim = {}", heads, C);
    if (w.size() > 3 && w[3] != "recompute")
      fail_input("model.layers: '{}': the third argument is 'recompute' or nothing", spec);
    return make_block(C, heads, ctx.blocks, w.size() > 2 ? prob(w[2]) : 0.0f, index, w.size() > 3);
  }
  if (k == "layernorm") {
    nargs(0, 0);
    if (in.empty()) fail_input("model.layers: '{}' needs an input", spec);
    return make_layernorm(int(in.back()));
  }
  if (k == "lmhead") {
    nargs(0, 0);
    return make_lm_head(ctx.classes);
  }
  fail_input("model.layers: '{}': unknown layer '{}' (linear, conv, maxpool, relu, gelu, "
             "flatten, dropout, embedding, block, layernorm, lmhead)", spec, k);
}

std::string short_kind(const std::string& spec) {
  auto w = words(spec);
  if (w.empty()) return "";
  const std::string& k = w[0];
  if (k == "linear") return "fc";
  return k;
}

// The whole model's layers (fused, named) and the per-sample shape entering each, plus the
// output shape at the end.
struct Built {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Shape> shapes;
};

Built build_layers(const ModelSpec& spec, const Shape& input_shape, int classes) {
  Built b;
  Shape shape = input_shape;
  std::map<std::string, int> counts;
  BuildContext ctx{.classes = classes};
  for (const auto& s : spec) ctx.blocks += short_kind(s) == "block";
  for (size_t i = 0; i < spec.size(); ++i) {
    // "relu, maxpool" runs as "maxpool, relu": max and ReLU commute exactly (ReLU is monotone,
    // so values, argmax and gradients are identical), and ReLU then touches 1/k^2 of the
    // elements: 12% of a CNN step before, 3% after.
    size_t at = i;
    if (i + 1 < spec.size() && short_kind(spec[i]) == "relu" && short_kind(spec[i + 1]) == "maxpool")
      at = i + 1;
    else if (i > 0 && short_kind(spec[i]) == "maxpool" && short_kind(spec[i - 1]) == "relu")
      at = i - 1;
    auto layer = parse_layer(spec[at], shape, int(at), ctx);
    std::string kind = short_kind(spec[at]);
    layer->name = fmt::format("{}{}", kind, ++counts[kind]);
    // "linear, relu" runs as one layer: bias and ReLU in the GEMM's epilogue, and one pass for
    // the ReLU's and the bias's gradients (same values; the ReLU's input is not stored).
    if (!b.layers.empty())
      if (auto fused = fuse_linear_relu(b.layers.back(), layer)) {  // same shape out
        b.layers.back() = std::move(fused);
        continue;
      }
    if (!b.layers.empty())
      if (auto fused = fuse_conv_pool(b.layers.back(), layer)) {
        shape = fused->output_shape(b.shapes.back());
        b.layers.back() = std::move(fused);
        continue;
      }
    b.shapes.push_back(shape);
    shape = layer->output_shape(shape);
    b.layers.push_back(std::move(layer));
  }
  b.shapes.push_back(shape);
  // A classifier gives (classes) per sample; a language model (T, vocab): a row per position.
  if (shape.empty() || shape.back() != classes)
    fail_input("model: the last layer gives {} per sample; the data has {} classes (end the "
               "model with \"linear {}\")", shape_str(shape), classes, classes);
  return b;
}

int64_t param_count(const Layer& l) {
  int64_t n = 0;
  for (auto& p : l.params) n += numel(p.shape);
  return n;
}

}  // namespace

std::vector<LayerInfo> Model::describe_layers(const ModelSpec& spec, const Shape& input_shape,
                                              int classes) {
  Built b = build_layers(spec, input_shape, classes);
  std::vector<LayerInfo> out;
  for (size_t i = 0; i < b.layers.size(); ++i)
    out.push_back({.name = b.layers[i]->name, .describe = b.layers[i]->describe(),
                   .in_shape = b.shapes[i], .out_shape = b.shapes[i + 1],
                   .params = param_count(*b.layers[i]),
                   .flops = b.layers[i]->flops_per_sample(b.shapes[i])});
  return out;
}

Model::Model(const ModelSpec& spec, Shape input_shape, int classes, LayerRange stage)
    : spec_(spec), input_shape_(std::move(input_shape)), classes_(classes) {
  Built b = build_layers(spec, input_shape_, classes);
  total_layers_ = int(b.layers.size());
  const int last = stage.last < 0 ? total_layers_ : stage.last;
  STRATA_CHECK(0 <= stage.first && stage.first < last && last <= total_layers_,
               "layer range [{}, {}) of a {}-layer model", stage.first, last, total_layers_);
  first_ = stage.first;
  // Later stages' parameters come first in the whole model's flat layout.
  for (int i = last; i < total_layers_; ++i) offset_in_whole_ += param_count(*b.layers[size_t(i)]);
  for (int i = first_; i < last; ++i) layers_.push_back(std::move(b.layers[size_t(i)]));
  shapes_.assign(b.shapes.begin() + first_, b.shapes.begin() + last + 1);

  // Flat layout in reverse layer order: backward finishes gradients front to back.
  int64_t total = 0;
  for (auto& l : layers_) total += param_count(*l);
  values_ = Tensor({total});
  grads_ = Tensor({total});
  host_values_ = values_;  // shares storage until place() moves values_ to a device
  int64_t off = 0;
  ready_after_.assign(layers_.size(), 0);
  for (size_t i = layers_.size(); i-- > 0;) {
    for (auto& p : layers_[i]->params) {
      p.name = layers_[i]->name + "." + p.name;
      p.offset = off;
      p.value = p.host = values_.data() + off;
      p.grad = grads_.data() + off;
      off += numel(p.shape);
    }
    ready_after_[i] = off;
  }
  for (auto& l : layers_)
    for (auto& p : l->params) params_.push_back(&p);
  // GPT-2's output layer reads the token embedding's table: both must be on this stage.
  for (auto& h : layers_) {
    if (!h->describe().starts_with("LM head")) continue;
    bool tied = false;
    for (auto& e : layers_) tied = tied || tie_lm_head(*h, *e);
    if (!tied)
      fail_input("model: the LM head shares the token embedding's table, so both must be on "
                 "one pipeline stage (parallel.pipeline_stages = 1 for a GPT, for now)");
  }
  set_slot(0);
}

void Model::set_slot(int k) {
  while (int(acts_.size()) <= k) {
    acts_.emplace_back();
    acts_.back().outs.resize(layers_.size());
    acts_.back().douts.resize(layers_.size());
  }
  slot_ = k;
  for (auto& l : layers_) l->set_slot(k);
}

int64_t Model::activation_bytes(int k) const {
  int64_t n = 0;
  for (size_t i = 0; i < layers_.size(); ++i)
    if (!layers_[i]->is_reshape()) n += acts_[size_t(k)].outs[i].size();
  return n * int64_t(sizeof(float));
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

void Model::check_backend(const Backend& be) const {
  for (auto& l : layers_) {
    const std::string d = l->describe();
    const bool transformer = d.starts_with("Embedding") || d.starts_with("Block") ||
                             d.starts_with("LayerNorm") || d.starts_with("LM head");
    if (transformer && !be.attention_forward)
      fail_input("model: {} has no kernels on the {} backend yet (use --device cpu)", d, be.name);
    if (transformer && !be.host_memory() && d.starts_with("Embedding"))
      fail_input("model: {} reads token ids on the host; the {} backend keeps them in device "
                 "memory (use --device cpu)", d, be.name);
  }
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
    const int64_t n = numel(p->shape);
    switch (p->init) {
      case Param::Init::kUniformFanIn: {
        const float bound = 1.0f / std::sqrt(float(p->fan_in));
        for (int64_t i = 0; i < n; ++i) p->host[i] = rng.uniform(-bound, bound);
        break;
      }
      case Param::Init::kNormal:  // Box-Muller on the counter-based stream: platform independent
        for (int64_t i = 0; i < n; i += 2) {
          const float u1 = 1.0f - rng.uniform(0.f, 1.f), u2 = rng.uniform(0.f, 1.f);
          const float r = p->std * std::sqrt(-2.0f * std::log(u1)), a = 6.28318530718f * u2;
          p->host[i] = r * std::cos(a);
          if (i + 1 < n) p->host[i + 1] = r * std::sin(a);
        }
        break;
      case Param::Init::kOnes: std::fill(p->host, p->host + n, 1.0f); break;
      case Param::Init::kZeros: std::fill(p->host, p->host + n, 0.0f); break;
    }
  }
  // (on a device, place() or push() uploads them)
}

void Model::place(const Backend& be) {
  if (values_.memory == be.memory) return;
  values_ = Tensor({host_values_.size()}, *be.memory);
  grads_ = Tensor({host_values_.size()}, *be.memory);
  for (Param* p : params_) {
    p->value = values_.data() + p->offset;
    p->grad = grads_.data() + p->offset;
  }
  push(be);
}

void Model::pull(const Backend& be) {
  if (values_.data() != host_values_.data())
    be.download(host_values_.data(), values_.data(), sizeof(float) * size_t(values_.size()));
}

void Model::push(const Backend& be) {
  if (values_.data() != host_values_.data())
    be.upload(values_.data(), host_values_.data(), sizeof(float) * size_t(values_.size()));
}

const Tensor& Model::forward(const Backend& be, const Tensor& x, const StepInfo& s) {
  Activations& a = acts_[size_t(slot_)];
  a.input = &x;
  const int64_t b = x.dim(0);
  const Tensor* in = &x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Shape os = batched(b, shapes_[i + 1]);
    const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (layers_[i]->is_reshape()) {
      a.outs[i] = Tensor::view(const_cast<float*>(in->data()), os, *in->memory);
    } else {
      a.outs[i].resize(os, *be.memory);
      layers_[i]->forward(be, *in, a.outs[i], s);
    }
    if (profile_) {
      be.synchronize();  // a device's ops are asynchronous: time what they did
      (*profile_)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    in = &a.outs[i];
  }
  return *in;
}

const Tensor* Model::backward(const Backend& be, const Tensor& dout,
                              const std::function<void(int64_t)>& on_ready, bool accumulate) {
  Activations& a = acts_[size_t(slot_)];
  STRATA_CHECK(a.input, "backward before forward");
  const int64_t b = a.input->dim(0);
  const Tensor* dy = &dout;
  // The first stage needs no gradient below its lowest layer with parameters: that layer
  // skips its input gradient (for the MLP, fc1's 64x784 product behind the flatten: a third
  // of backward's FLOPs) and the layers under it skip backward altogether, as autograd does
  // for data. Later stages send the gradient at their input to the stage before.
  const bool input_grad = first_ > 0;
  size_t lowest = 0;
  if (!input_grad) {
    lowest = layers_.size();
    for (size_t i = 0; i < layers_.size(); ++i)
      if (!layers_[i]->params.empty()) {
        lowest = i;
        break;
      }
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    if (i < lowest) {
      if (on_ready) on_ready(ready_after_[i]);
      continue;
    }
    const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const Tensor& x = i ? a.outs[i - 1] : *a.input;
    Tensor* dx = nullptr;
    if (i > lowest || input_grad) {
      const Shape is = batched(b, shapes_[i]);
      if (layers_[i]->is_reshape()) a.douts[i] = Tensor::view(const_cast<float*>(dy->data()), is, *dy->memory);
      else a.douts[i].resize(is, *be.memory);
      dx = &a.douts[i];
    }
    if (!layers_[i]->is_reshape()) layers_[i]->backward(be, x, a.outs[i], *dy, dx, accumulate);
    if (profile_) {
      be.synchronize();  // a device's ops are asynchronous: time what they did
      (*profile_)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (on_ready) on_ready(ready_after_[i]);
    dy = dx;
  }
  return input_grad ? &a.douts[0] : nullptr;
}

}  // namespace strata
