#include "config/model_spec.h"

#include <exception>
#include <sstream>

#include <fmt/format.h>

#include "base/parse.h"
#include "strata/error.h"

namespace strata {
namespace {

using Kind = LayerSpec::Kind;

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string t; in >> t;) w.push_back(t);
  return w;
}

// A size in a layer spec: a positive integer of at most 2^24, so that the layers' products of
// sizes (a block's 4 x width, conv channels x kernel^2, ...) stay within int arithmetic.
constexpr int kMaxLayerSize = 1 << 24;
int int_arg(const std::string& where, const std::string& spec, const std::string& w) {
  std::string why;
  auto v = parse_int(w, &why);
  if (!v || *v < 1)
    fail_input("{}: '{}': '{}' is not a positive integer", where, spec, w);
  if (*v > kMaxLayerSize)
    fail_input("{}: '{}': {} is larger than {} (2^24)", where, spec, *v, kMaxLayerSize);
  return int(*v);
}

float prob_arg(const std::string& where, const std::string& spec, const std::string& v) {
  float p = -1;
  try {
    p = std::stof(v);
  } catch (const std::exception&) {
  }
  if (!(p >= 0 && p < 1)) fail_input("{}: '{}': p must be in [0, 1)", where, spec);
  return p;
}

struct KindInfo {
  Kind kind;
  const char* name;
  size_t min_args, max_args;
};
constexpr KindInfo kKinds[] = {
    {Kind::kLinear, "linear", 1, 1},       {Kind::kConv, "conv", 2, 4},
    {Kind::kMaxPool, "maxpool", 1, 2},     {Kind::kRelu, "relu", 0, 0},
    {Kind::kGelu, "gelu", 0, 0},           {Kind::kSilu, "silu", 0, 0},
    {Kind::kFlatten, "flatten", 0, 0},
    {Kind::kDropout, "dropout", 1, 1},     {Kind::kEmbedding, "embedding", 1, 2},
    {Kind::kBlock, "block", 1, 4},         {Kind::kLayerNorm, "layernorm", 0, 0},
    {Kind::kLmHead, "lmhead", 0, 0},
};

LayerSpec make(Kind kind) {
  LayerSpec s;
  s.kind = kind;
  return s;
}
LayerSpec finish(LayerSpec s) {
  s.source = s.text();
  return s;
}

}  // namespace

LayerSpec parse_layer_spec(const std::string& text, const std::string& where) {
  const auto w = words(text);
  if (w.empty()) fail_input("{}: empty layer spec", where);
  const KindInfo* info = nullptr;
  for (const auto& k : kKinds)
    if (w[0] == k.name) info = &k;
  if (!info)
    fail_input("{}: '{}': unknown layer '{}' (linear, conv, maxpool, relu, gelu, silu, "
               "flatten, dropout, embedding, block, layernorm, lmhead)", where, text, w[0]);
  if (w.size() - 1 < info->min_args || w.size() - 1 > info->max_args)
    fail_input("{}: '{}': {} takes {} to {} arguments", where, text, w[0], info->min_args,
               info->max_args);
  LayerSpec s = make(info->kind);
  s.source = text;
  auto size = [&](size_t i) { return int_arg(where, text, w[i]); };
  switch (s.kind) {
    case Kind::kLinear: s.size = size(1); break;
    case Kind::kEmbedding: s.size = size(1), s.pad = w.size() > 2 ? size(2) : 0; break;
    case Kind::kConv:
      s.size = size(1), s.kernel = size(2);
      s.stride = w.size() > 3 ? size(3) : 1;
      s.pad = w.size() > 4 && w[4] != "0" ? size(4) : 0;
      break;
    case Kind::kMaxPool: s.kernel = size(1), s.stride = w.size() > 2 ? size(2) : s.kernel; break;
    case Kind::kDropout: s.p = prob_arg(where, text, w[1]); break;
    case Kind::kBlock:
      s.size = size(1);
      s.p = w.size() > 2 ? prob_arg(where, text, w[2]) : 0.0f;
      for (size_t i = 3; i < w.size(); ++i) {  // the words after DROPOUT, each at most once
        bool& flag = w[i] == "recompute" ? s.recompute : s.gelu_tanh;
        if ((w[i] != "recompute" && w[i] != "tanh") || flag)
          fail_input("{}: '{}': after the dropout come 'recompute' and 'tanh', each at most once",
                     where, text);
        flag = true;
      }
      break;
    default: break;
  }
  return s;
}

ModelSpec parse_model_spec(const std::vector<std::string>& texts, const std::string& where) {
  ModelSpec spec;
  for (const auto& t : texts) spec.push_back(parse_layer_spec(t, where));
  return spec;
}

std::vector<std::string> spec_texts(const ModelSpec& spec) {
  std::vector<std::string> out;
  for (const auto& s : spec) out.push_back(s.text());
  return out;
}

LayerSpec::LayerSpec(const char* text) : LayerSpec(parse_layer_spec(text, "model.layers")) {}
LayerSpec::LayerSpec(const std::string& text)
    : LayerSpec(parse_layer_spec(text, "model.layers")) {}

const char* LayerSpec::kind_name() const {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

std::string LayerSpec::text() const {
  switch (kind) {
    case Kind::kLinear: return fmt::format("linear {}", size);
    case Kind::kEmbedding:  // unpadded as before, so older files' specs compare equal
      return pad > 0 ? fmt::format("embedding {} {}", size, pad) : fmt::format("embedding {}", size);
    case Kind::kConv: return fmt::format("conv {} {} {} {}", size, kernel, stride, pad);
    case Kind::kMaxPool:
      return stride == kernel ? fmt::format("maxpool {}", kernel)
                              : fmt::format("maxpool {} {}", kernel, stride);
    case Kind::kDropout: return fmt::format("dropout {}", p);
    case Kind::kBlock:
      if (recompute || gelu_tanh)
        return fmt::format("block {} {}{}{}", size, p, recompute ? " recompute" : "", gelu_tanh ? " tanh" : "");
      return p > 0 ? fmt::format("block {} {}", size, p) : fmt::format("block {}", size);
    default: return kind_name();
  }
}

bool LayerSpec::operator==(const LayerSpec& o) const {
  return kind == o.kind && size == o.size && kernel == o.kernel && stride == o.stride &&
         pad == o.pad && p == o.p && recompute == o.recompute && gelu_tanh == o.gelu_tanh;
}

LayerSpec linear_spec(int out) {
  LayerSpec s = make(Kind::kLinear);
  s.size = out;
  return finish(s);
}
LayerSpec conv_spec(int channels, int kernel, int stride, int pad) {
  LayerSpec s = make(Kind::kConv);
  s.size = channels, s.kernel = kernel, s.stride = stride, s.pad = pad;
  return finish(s);
}
LayerSpec maxpool_spec(int kernel) {
  LayerSpec s = make(Kind::kMaxPool);
  s.kernel = s.stride = kernel;
  return finish(s);
}
LayerSpec activation_spec(const std::string& name) {
  return finish(make(name == "gelu" ? Kind::kGelu : name == "silu" ? Kind::kSilu : Kind::kRelu));
}
LayerSpec flatten_spec() { return finish(make(Kind::kFlatten)); }
LayerSpec dropout_spec(float p) {
  LayerSpec s = make(Kind::kDropout);
  s.p = p;
  return finish(s);
}
LayerSpec embedding_spec(int dim, int row_multiple) {
  LayerSpec s = make(Kind::kEmbedding);
  s.size = dim, s.pad = row_multiple;
  return finish(s);
}
LayerSpec block_spec(int heads, float dropout, bool recompute, bool gelu_tanh) {
  LayerSpec s = make(Kind::kBlock);
  s.size = heads, s.p = dropout, s.recompute = recompute, s.gelu_tanh = gelu_tanh;
  return finish(s);
}
LayerSpec layernorm_spec() { return finish(make(Kind::kLayerNorm)); }
LayerSpec lmhead_spec() { return finish(make(Kind::kLmHead)); }

}  // namespace strata
