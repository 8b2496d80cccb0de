#include "model/layer_stack.h"

#include <map>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/parse.h"
#include "strata/error.h"

namespace strata {
namespace {


// The model-wide facts some layers need: the class (vocabulary) count and the number of
// transformer blocks (GPT-2 scales its residual projections' init by it).
struct BuildContext {
  std::string where = "model.layers";  // where the spec came from, for messages
  int classes = 0;
  int blocks = 0;
  TensorSplit tp;  // the blocks' share of the tensor-parallel group
};

// The layer `s` describes, for input `in` (per sample): sizes inferred, shapes checked.
std::unique_ptr<Layer> build_layer(const LayerSpec& s, const Shape& in, int index,
                                   const BuildContext& ctx) {
  const std::string& where = ctx.where;
  const std::string& spec = s.source;
  switch (s.kind) {
    case LayerSpec::Kind::kLinear:
      if (in.size() != 1)
        fail_input("{}: '{}' needs a flat input but gets {}; add \"flatten\" before it", where,
                   spec, shape_str(in));
      return make_linear(int(in[0]), s.size);
    case LayerSpec::Kind::kConv:
      if (in.size() != 3) fail_input("{}: '{}' needs a (C, H, W) input, gets {}", where, spec, shape_str(in));
      return make_conv2d(int(in[0]), s.size, s.kernel, s.stride, s.pad);
    case LayerSpec::Kind::kMaxPool: return make_maxpool2d(s.kernel, s.stride);
    case LayerSpec::Kind::kRelu: return make_relu();
    case LayerSpec::Kind::kGelu: return make_gelu();
    case LayerSpec::Kind::kSilu: return make_silu();
    case LayerSpec::Kind::kFlatten: return make_flatten();
    case LayerSpec::Kind::kDropout: return make_dropout(s.p, index);
    case LayerSpec::Kind::kEmbedding:
      if (in.size() != 1)
        fail_input("{}: '{}' needs token ids (T) per sample, gets {}", where, spec, shape_str(in));
      return make_embedding(ctx.classes, s.size, int(in[0]), s.pad);
    case LayerSpec::Kind::kBlock: {
      if (in.size() != 2) fail_input("{}: '{}' needs (T, C) per sample, gets {}", where, spec, shape_str(in));
      const int heads = s.size, C = int(in[1]);
      if (C % heads != 0)
        fail_input("{}: '{}': {} heads do not divide the width {} (model.heads, model.dim)",
                   where, spec, heads, C);
      if (heads % ctx.tp.size != 0)
        fail_input("parallel.tensor = {} does not divide model.heads = {} (each tensor-parallel "
                   "rank holds whole attention heads)", ctx.tp.size, heads);
      return make_block(C, heads, ctx.blocks, s.p, index, s.recompute, s.gelu_tanh, ctx.tp);
    }
    case LayerSpec::Kind::kLayerNorm:
      if (in.empty()) fail_input("{}: '{}' needs an input", where, spec);
      return make_layernorm(int(in.back()));
    case LayerSpec::Kind::kLmHead: return make_lm_head(ctx.classes);
  }
  fail_input("{}: '{}': unknown layer", where, spec);
}

// A layer's name prefix: "fc" for linear layers, else the kind ("conv", "block", ...).
std::string short_kind(const LayerSpec& s) {
  return s.kind == LayerSpec::Kind::kLinear ? "fc" : s.kind_name();
}

}  // namespace

LayerStack build_layers(const ModelSpec& spec, const Shape& input_shape, int classes,
                        TensorSplit tp, const std::string& where) {
  LayerStack b;
  Shape shape = input_shape;
  std::map<std::string, int> counts;
  BuildContext ctx{.where = where, .classes = classes, .tp = tp};
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
    auto layer = build_layer(spec[at], shape, int(at), ctx);
    std::string kind = short_kind(spec[at]);
    layer->name = fmt::format("{}{}", kind, ++counts[kind]);
    // "linear, relu" runs as one layer: bias and ReLU in the GEMM's epilogue, and one pass for
    // the ReLU's and the bias's gradients (same values; the ReLU's input is not stored).
    if (!b.layers.empty())
      if (auto fused = fuse_linear_relu(b.layers.back(), layer)) {  // same shape out
        b.layers.back() = std::move(fused);
        continue;
      }
    if (!b.layers.empty() && fuse_conv_pool_relu(b.layers.back(), layer)) continue;  // same shape
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
  for (auto& l : b.layers)
    for (auto& p : l->params)
      if (p.whole_shape.empty()) p.whole_shape = p.shape;
  // A classifier gives (classes) per sample; a language model (T, vocab): a row per position.
  if (shape.empty() || shape.back() != classes)
    fail_input("{}: the last layer gives {} per sample; the data has {} classes (end the "
               "model with \"linear {}\")", where == "model.layers" ? "model" : where,
               shape_str(shape), classes, classes);
  return b;
}

int64_t param_count(const Layer& l) {
  int64_t n = 0;
  for (auto& p : l.params) n += numel(p.shape);
  return n;
}
int64_t flat_count(const Layer& l) {
  int64_t n = 0;
  for (auto& p : l.params) n += flat_span(numel(p.shape));
  return n;
}
int64_t whole_flat_count(const Layer& l) {
  int64_t n = 0;
  for (auto& p : l.params) n += flat_span(numel(p.whole_shape));
  return n;
}

void require_model_memory(const std::vector<LayerInfo>& layers, LayerRange range, double copies,
                          int tensor_parts, int64_t batch_samples, const std::string& who) {
  require_chunks_memory(layers, {range}, copies, tensor_parts, batch_samples, who);
}

void require_chunks_memory(const std::vector<LayerInfo>& layers, const std::vector<LayerRange>& ranges,
                          double copies, int tensor_parts, int64_t batch_samples,
                          const std::string& who) {
  double params = 0, activations = 0;
  int count = 0;
  const LayerInfo* largest = nullptr;
  for (const LayerRange& range : ranges) {
    const int last = range.last < 0 ? int(layers.size()) : range.last;
    for (int i = range.first; i < last; ++i) {
      const LayerInfo& l = layers[size_t(i)];
      params += double(l.params);
      activations += double(numel(l.out_shape));
      if (!largest || l.params > largest->params) largest = &l;
      ++count;
    }
    if (range.first < last) activations += double(numel(layers[size_t(range.first)].in_shape));  // its input
  }
  if (!largest) return;
  const double bytes = 4.0 * (params * copies / tensor_parts + activations * double(batch_samples));
  const std::string what =
      count == 1
          ? fmt::format("layer {} = {} ({} parameters)", largest->name, largest->describe,
                        largest->params)
          : fmt::format("the model's {} layers ({:.0f} parameters; the largest, {} = {}, has {})",
                        count, params, largest->name, largest->describe, largest->params);
  require_memory(bytes, fmt::format("{}: {}, with gradients, optimizer state and one batch of "
                                    "{} samples,", who, what, batch_samples));
}

std::vector<std::pair<std::string, Shape>> describe_params(const ModelSpec& spec,
                                                           const Shape& input_shape, int classes,
                                                           const std::string& where) {
  LayerStack b = build_layers(spec, input_shape, classes, {}, where);
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& l : b.layers)
    for (auto& p : l->params) out.emplace_back(l->name + "." + p.name, p.whole_shape);
  return out;
}

std::vector<LayerInfo> describe_layers(const ModelSpec& spec, const Shape& input_shape, int classes,
                                       const std::string& where) {
  LayerStack b = build_layers(spec, input_shape, classes, {}, where);
  std::vector<LayerInfo> out;
  auto padding = [](const Layer& l) {
    int64_t n = 0;
    for (const Param& p : l.params)
      if (p.used_rows > 0) n += (p.shape[0] - p.used_rows) * (numel(p.shape) / p.shape[0]);
    return n;
  };
  auto tensors = [](const Layer& l) {
    std::vector<int64_t> v;
    for (const Param& p : l.params) v.push_back(numel(p.whole_shape));
    return v;
  };
  for (size_t i = 0; i < b.layers.size(); ++i)
    out.push_back({.name = b.layers[i]->name, .describe = b.layers[i]->describe(),
                   .in_shape = b.shapes[i], .out_shape = b.shapes[i + 1],
                   .params = param_count(*b.layers[i]), .padding = padding(*b.layers[i]),
                   .flat = whole_flat_count(*b.layers[i]), .tensors = tensors(*b.layers[i]),
                   .flops = b.layers[i]->flops_per_sample(b.shapes[i]),
                   .internal_bytes = b.layers[i]->internal_bytes_per_sample(b.shapes[i]),
                   .recomputes = b.layers[i]->recomputes(),
                   .reshape = b.layers[i]->is_reshape()});
  return out;
}

}  // namespace strata
