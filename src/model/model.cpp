#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

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
      return make_embedding(ctx.classes, s.size, int(in[0]));
    case LayerSpec::Kind::kBlock: {
      if (in.size() != 2) fail_input("{}: '{}' needs (T, C) per sample, gets {}", where, spec, shape_str(in));
      const int heads = s.size, C = int(in[1]);
      if (C % heads != 0)
        fail_input("{}: '{}': {} heads do not divide the width {} (model.heads, model.dim)",
                   where, spec, heads, C);
      if (heads % ctx.tp.size != 0)
        fail_input("parallel.tensor = {} does not divide model.heads = {} (each tensor-parallel "
                   "rank holds whole attention heads)", ctx.tp.size, heads);
      return make_block(C, heads, ctx.blocks, s.p, index, s.recompute, ctx.tp);
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

// The whole model's layers (fused, named) and the per-sample shape entering each, plus the
// output shape at the end.
struct Built {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<Shape> shapes;
};

Built build_layers(const ModelSpec& spec, const Shape& input_shape, int classes,
                   TensorSplit tp = {}, const std::string& where = "model.layers") {
  Built b;
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

int64_t param_count(const Layer& l) {  // this rank's share
  int64_t n = 0;
  for (auto& p : l.params) n += numel(p.shape);
  return n;
}
// Floats the layer's tensors span in the flat buffers (each padded to kFlatAlign): this rank's
// share, and unsplit (the layout of checkpoints' whole blocks).
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

// Part t of `parts` of a split parameter, as runs of consecutive elements:
// fn(offset in the part, offset in the whole tensor, count) for each.
template <class F>
void for_each_run(const Param& p, int t, int parts, F&& fn) {
  if (p.split_dim < 0 || parts == 1) {
    fn(int64_t(0), int64_t(0), numel(p.shape));
  } else if (p.split_dim == 0) {  // split_groups blocks of rows, each cut in `parts`
    const int64_t rows = p.whole_shape[0], inner = numel(p.whole_shape) / rows;
    const int64_t group_rows = rows / p.split_groups, r = group_rows / parts;
    for (int64_t j = 0; j < p.split_groups; ++j)
      fn(j * r * inner, (j * group_rows + t * r) * inner, r * inner);
  } else {  // (R, K) columns: (R, K / parts)
    const int64_t R = p.whole_shape[0], K = p.whole_shape[1], k = K / parts;
    for (int64_t i = 0; i < R; ++i) fn(i * k, i * K + t * k, k);
  }
}

}  // namespace

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

std::vector<std::pair<std::string, Shape>> Model::describe_params(const ModelSpec& spec,
                                                                 const Shape& input_shape,
                                                                 int classes,
                                                                 const std::string& where) {
  Built b = build_layers(spec, input_shape, classes, {}, where);
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& l : b.layers)
    for (auto& p : l->params) out.emplace_back(l->name + "." + p.name, p.whole_shape);
  return out;
}

std::vector<LayerInfo> Model::describe_layers(const ModelSpec& spec, const Shape& input_shape,
                                              int classes, const std::string& where) {
  Built b = build_layers(spec, input_shape, classes, {}, where);
  std::vector<LayerInfo> out;
  for (size_t i = 0; i < b.layers.size(); ++i)
    out.push_back({.name = b.layers[i]->name, .describe = b.layers[i]->describe(),
                   .in_shape = b.shapes[i], .out_shape = b.shapes[i + 1],
                   .params = param_count(*b.layers[i]),
                   .flat = whole_flat_count(*b.layers[i]),
                   .flops = b.layers[i]->flops_per_sample(b.shapes[i]),
                   .internal_bytes = b.layers[i]->internal_bytes_per_sample(b.shapes[i]),
                   .recomputes = b.layers[i]->recomputes()});
  return out;
}

std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& virtual_ranges, int stages,
                                     int stage) {
  std::vector<LayerRange> out;
  for (size_t k = size_t(stage); k < virtual_ranges.size(); k += size_t(stages)) out.push_back(virtual_ranges[k]);
  return out;
}

Model::Model(const ModelSpec& spec, Shape input_shape, int classes, LayerRange stage,
             TensorSplit tp)
    : Model(spec, std::move(input_shape), classes, std::vector<LayerRange>{stage}, tp) {}

Model::Model(const ModelSpec& spec, Shape input_shape, int classes, std::vector<LayerRange> chunks,
             TensorSplit tp)
    : spec_(spec), input_shape_(std::move(input_shape)), classes_(classes), tp_(tp) {
  Built b = build_layers(spec, input_shape_, classes, tp);
  const int total_layers = int(b.layers.size());
  std::vector<bool> here(size_t(total_layers), false);
  int prev_last = 0;
  for (LayerRange& r : chunks) {
    if (r.last < 0) r.last = total_layers;
    STRATA_CHECK(prev_last <= r.first && r.first < r.last && r.last <= total_layers,
                 "layer ranges [{}, {}) after {} of a {}-layer model", r.first, r.last, prev_last, total_layers);
    prev_last = r.last;
    for (int i = r.first; i < r.last; ++i) here[size_t(i)] = true;
  }
  STRATA_CHECK(!chunks.empty(), "a model with no layers");
  // GPT-2's output layer reads the token embedding's table. On a stage holding the head but
  // not the embedding (a pipeline's last stage), the head reads a copy of the table, named as
  // the table is (so init gives it the same values), kept after the stage's block in the flat
  // buffers; the trainer sums its gradient with the table's (tied_table()).
  bool head_here = false, embedding_here = false, head_anywhere = false;
  Param* whole_table = nullptr;
  std::string table_name;
  for (int i = 0; i < total_layers; ++i) {
    Layer& l = *b.layers[size_t(i)];
    head_anywhere = head_anywhere || is_lm_head(l);
    if (Param* t = token_table(l)) {
      whole_table = t;
      table_name = l.name + "." + t->name;
      embedding_here = embedding_here || here[size_t(i)];
    }
    head_here = head_here || (here[size_t(i)] && is_lm_head(l));
  }
  if (head_here && !embedding_here) {
    if (!whole_table) fail_input("model: the LM head needs an embedding layer before it");
    tied_copy_ = std::make_unique<Param>(*whole_table);
    tied_copy_->name = table_name;
  }
  // Each chunk's block in the whole model: the parameters of the layers after it come first.
  int64_t block_at = 0;
  for (size_t c = chunks.size(); c-- > 0;) {
    Segment g{.block_offset = block_at, .whole_offset = 0, .count = 0};
    for (int i = chunks[c].last; i < total_layers; ++i) g.whole_offset += whole_flat_count(*b.layers[size_t(i)]);
    for (int i = chunks[c].first; i < chunks[c].last; ++i) g.count += whole_flat_count(*b.layers[size_t(i)]);
    segments_.push_back(g);
    block_at += g.count;
  }
  for (const LayerRange& r : chunks) {
    chunk_begin_.push_back(int(layers_.size()));
    input_grad_.push_back(r.first > 0);
    for (int i = r.first; i < r.last; ++i) {
      layers_.push_back(std::move(b.layers[size_t(i)]));
      in_shapes_.push_back(b.shapes[size_t(i)]);
      out_shapes_.push_back(b.shapes[size_t(i) + 1]);
    }
  }
  chunk_begin_.push_back(int(layers_.size()));
  for (size_t c = 0; c < chunks.size(); ++c) lowest_.push_back(lowest_with_input_grad(c));

  // Flat layout in reverse layer order: backward finishes gradients front to back. Every
  // tensor starts on a 256-byte boundary (flat_span); `packed` counts the same tensors back
  // to back (the gradient norm's order, ZeRO's split).
  int64_t total = 0;
  for (auto& l : layers_) total += flat_count(*l);
  block_params_ = total;
  if (tied_copy_) total += flat_span(numel(tied_copy_->shape));
  values_ = Tensor({total});
  grads_ = Tensor({total});
  host_values_ = values_;  // shares storage until place() moves values_ to a device
  int64_t off = 0, whole_off = 0;
  ready_after_.assign(layers_.size(), 0);
  auto bind = [&](Param& p) {
    p.offset = off;
    p.packed = packed_params_;
    p.whole_offset = whole_off;
    p.value = p.host = values_.data() + off;
    p.grad = grads_.data() + off;
    off += flat_span(numel(p.shape));
    packed_params_ += numel(p.shape);
    whole_off += flat_span(numel(p.whole_shape));
    by_packed_.push_back(&p);
  };
  for (size_t i = layers_.size(); i-- > 0;) {
    for (auto& p : layers_[i]->params) {
      p.name = layers_[i]->name + "." + p.name;
      bind(p);
    }
    ready_after_[i] = off;
  }
  whole_block_params_ = whole_off;
  for (auto& l : layers_)
    for (auto& p : l->params) params_.push_back(&p);
  if (tied_copy_) {
    bind(*tied_copy_);
    params_.push_back(tied_copy_.get());
  }
  for (auto& h : layers_) {
    if (!is_lm_head(*h)) continue;
    bool tied = tied_copy_ && tie_lm_head(*h, *tied_copy_);
    for (auto& e : layers_) tied = tied || tie_lm_head(*h, *e);
    STRATA_CHECK(tied, "LM head {} not tied", h->name);
  }
  if (embedding_here && head_anywhere && !head_here)
    for (auto& e : layers_)
      if (Param* t = token_table(*e)) shared_table_ = t;
  slot(0);
}

Param* Model::tied_table() const { return tied_copy_ ? tied_copy_.get() : shared_table_; }

std::vector<FlatPieces> Model::norm_ranges() const {
  std::vector<FlatPieces> r;
  int64_t packed_end = -1;  // of the last range
  for (const Param* p : params_) {
    if (p == tied_copy_.get() || (tp_.rank != 0 && p->split_dim < 0)) continue;
    if (r.empty() || p->packed != packed_end) r.emplace_back();  // not adjacent when packed
    r.back().push_back({p->offset, numel(p->shape)});
    packed_end = p->packed + numel(p->shape);
  }
  return r;
}

int64_t Model::flat_index(int64_t k) const {
  // The tensor holding packed index k: the last whose packed offset is at most k (at a
  // boundary, the next tensor's start: the padding goes with the tensor before it).
  auto it = std::upper_bound(by_packed_.begin(), by_packed_.end(), k,
                             [](int64_t v, const Param* p) { return v < p->packed; });
  if (it == by_packed_.begin()) return 0;
  const Param* p = *(it - 1);
  if (k >= p->packed + numel(p->shape)) return it == by_packed_.end() ? num_params() : (*it)->offset;
  return p->offset + (k - p->packed);
}

std::vector<int64_t> Model::flat_counts(const std::vector<int64_t>& packed_counts) const {
  std::vector<int64_t> out;
  int64_t k = 0, at = 0;
  for (int64_t c : packed_counts) {
    k += c;
    const int64_t end = flat_index(k);
    out.push_back(end - at);
    at = end;
  }
  return out;
}

void Model::assemble(const std::vector<const float*>& parts, float* whole) const {
  STRATA_CHECK(int(parts.size()) == tp_.size, "{} parts for {} tensor ranks", parts.size(), tp_.size);
  for (const Param* p : params_) {
    if (p == tied_copy_.get()) continue;
    for (int t = 0; t < tp_.size; ++t) {
      const float* src = parts[size_t(t)] + p->offset;
      float* dst = whole + p->whole_offset;
      for_each_run(*p, t, tp_.size, [&](int64_t at_part, int64_t at_whole, int64_t n) {
        std::copy_n(src + at_part, n, dst + at_whole);
      });
      if (p->split_dim < 0) break;  // every rank holds the same: take rank 0's
    }
  }
}

void Model::extract(const float* whole, float* mine) const {
  for (const Param* p : params_) {
    if (p == tied_copy_.get()) continue;
    const float* src = whole + p->whole_offset;
    float* dst = mine + p->offset;
    for_each_run(*p, tp_.rank, tp_.size, [&](int64_t at_part, int64_t at_whole, int64_t n) {
      std::copy_n(src + at_whole, n, dst + at_part);
    });
  }
}

Model::Activations& Model::slot(int k) {
  while (int(acts_.size()) <= k) {
    acts_.emplace_back();
    acts_.back().outs.resize(layers_.size());
    acts_.back().douts.resize(layers_.size());
  }
  return acts_[size_t(k)];
}

int64_t Model::activation_bytes(int k) const {
  int64_t n = 0;
  const Activations& a = acts_[size_t(k)];
  for (int i = chunk_begin_[size_t(a.chunk)]; i < chunk_begin_[size_t(a.chunk) + 1]; ++i)
    if (!layers_[size_t(i)]->is_reshape()) n += a.outs[size_t(i)].size();
  return n * int64_t(sizeof(float));
}

std::string Model::summary() const {
  std::string s;
  for (size_t i = 0; i < layers_.size(); ++i) {
    int64_t n = 0;
    for (auto& p : layers_[i]->params) n += numel(p.shape);
    s += fmt::format("  {:<8} {:<40} -> {:<16} {:>10}\n", layers_[i]->name, layers_[i]->describe(),
                     shape_str(out_shapes_[i]), n ? fmt::format("{} params", n) : "");
  }
  return s + fmt::format("  total {} parameters, {:.2f} MFLOP per sample forward", values_.size(),
                         flops_per_sample() * 1e-6);
}

void Model::check_backend(const Backend& be) const {
  for (auto& l : layers_)
    for (Op op : l->ops())
      if (!be.supports(op))
        fail_input("model: {} ({}) needs the op {}, which the {} backend does not have (use "
                   "--device cpu)", l->name, l->describe(), op_name(op), be.name);
  if (int8_ && !int8_->weights.empty() && !be.supports(Op::linear_int8_forward))
    fail_input("model: its int8 weights need the op linear_int8_forward, which the {} backend "
               "does not have (int8 inference runs on the CPU: use --device cpu)", be.name);
}

std::vector<Int8Target> Model::int8_targets() const {
  std::vector<Int8Target> out;
  for (auto& l : layers_)
    for (auto& t : l->int8_targets()) out.push_back(std::move(t));
  return out;
}

void Model::set_int8(Int8Table* table) {
  int8_ = table;
  for (auto& l : layers_) l->int8 = table;
}

double Model::flops_per_sample() const {
  double f = 0;
  for (size_t i = 0; i < layers_.size(); ++i) f += layers_[i]->flops_per_sample(in_shapes_[i]);
  return f;
}

void Model::init(uint64_t seed) {
  std::vector<float> whole;  // a split parameter's whole tensor, of which this rank keeps a part
  for (Param* p : params_) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (unsigned char c : p->name) h = (h ^ c) * 1099511628211ull;
    Rng rng(hash_combine(seed, h));
    const int64_t n = numel(p->whole_shape);
    float* v = p->host;
    if (p->split_dim >= 0) {
      whole.resize(size_t(n));
      v = whole.data();
    }
    switch (p->init) {
      case Param::Init::kUniformFanIn: {
        const float bound = 1.0f / std::sqrt(float(p->fan_in));
        for (int64_t i = 0; i < n; ++i) v[i] = rng.uniform(-bound, bound);
        break;
      }
      case Param::Init::kNormal:  // Box-Muller on the counter-based stream: platform independent
        for (int64_t i = 0; i < n; i += 2) {
          const float u1 = 1.0f - rng.uniform(0.f, 1.f), u2 = rng.uniform(0.f, 1.f);
          const float r = p->std * std::sqrt(-2.0f * std::log(u1)), a = 6.28318530718f * u2;
          v[i] = r * std::cos(a);
          if (i + 1 < n) v[i + 1] = r * std::sin(a);
        }
        break;
      case Param::Init::kOnes: std::fill(v, v + n, 1.0f); break;
      case Param::Init::kZeros: std::fill(v, v + n, 0.0f); break;
    }
    if (p->split_dim >= 0)
      for_each_run(*p, tp_.rank, tp_.size, [&](int64_t at_part, int64_t at_whole, int64_t k) {
        std::copy_n(v + at_whole, k, p->host + at_part);
      });
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
  STRATA_CHECK(0 <= s.chunk && s.chunk < chunks(), "chunk {} of {}", s.chunk, chunks());
  Activations& a = slot(s.slot);
  a.input = &x;
  a.chunk = s.chunk;
  const int64_t b = x.dim(0);
  const Tensor* in = &x;
  for (size_t i = size_t(chunk_begin_[size_t(s.chunk)]); i < size_t(chunk_begin_[size_t(s.chunk) + 1]); ++i) {
    const Shape os = batched(b, out_shapes_[i]);
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

const Tensor* Model::backward(const Backend& be, const Tensor& dout, int k,
                              const std::function<void(int64_t)>& on_ready, bool accumulate) {
  return run_backward(be, dout, k, on_ready, accumulate, Pass::kWhole);
}

const Tensor* Model::backward_input(const Backend& be, const Tensor& dout, int k, bool accumulate) {
  slot(k).dout = &dout;
  return run_backward(be, dout, k, nullptr, accumulate, Pass::kInput);
}

// The first stage needs no gradient below its lowest layer with parameters: that layer
// skips its input gradient (for the MLP, fc1's 64x784 product behind the flatten: a third
// of backward's FLOPs) and the layers under it skip backward altogether, as autograd does
// for data. Later stages send the gradient at their input to the stage before.
size_t Model::lowest_with_input_grad(size_t chunk) const {
  const size_t begin = size_t(chunk_begin_[chunk]), end = size_t(chunk_begin_[chunk + 1]);
  if (input_grad_[chunk]) return begin;
  for (size_t i = begin; i < end; ++i)
    if (!layers_[i]->params.empty()) return i;
  return end;
}

const Tensor* Model::run_backward(const Backend& be, const Tensor& dout, int k,
                                  const std::function<void(int64_t)>& on_ready, bool accumulate,
                                  Pass pass) {
  Activations& a = slot(k);
  STRATA_CHECK(a.input, "backward before forward");
  const int64_t b = a.input->dim(0);
  const Tensor* dy = &dout;
  const size_t begin = size_t(chunk_begin_[size_t(a.chunk)]), end = size_t(chunk_begin_[size_t(a.chunk) + 1]);
  const bool input_grad = input_grad_[size_t(a.chunk)];
  const size_t lowest = lowest_[size_t(a.chunk)];
  for (size_t i = end; i-- > begin;) {
    if (i < lowest) {
      if (on_ready) on_ready(ready_after_[i]);
      continue;
    }
    const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const Tensor& x = i > begin ? a.outs[i - 1] : *a.input;
    Tensor* dx = nullptr;
    if (i > lowest || input_grad) {
      const Shape is = batched(b, in_shapes_[i]);
      if (layers_[i]->is_reshape()) a.douts[i] = Tensor::view(const_cast<float*>(dy->data()), is, *dy->memory);
      else a.douts[i].resize(is, *be.memory);
      dx = &a.douts[i];
    }
    Layer& l = *layers_[i];
    if (!l.is_reshape()) {
      if (pass == Pass::kWhole) l.backward(be, x, a.outs[i], *dy, dx, k, accumulate);
      else l.backward_input(be, x, a.outs[i], *dy, dx, k, accumulate);
    }
    if (profile_) {
      be.synchronize();  // a device's ops are asynchronous: time what they did
      (*profile_)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (on_ready) on_ready(ready_after_[i]);
    dy = dx;
  }
  return input_grad ? &a.douts[begin] : nullptr;
}

// W: each layer's parameter gradients from its input (kept from forward) and the gradient at
// its output (kept from B: the layer above's input gradient, or the stage's).
void Model::backward_weight(const Backend& be, int k, const std::function<void(int64_t)>& on_ready,
                            bool accumulate) {
  Activations& a = slot(k);
  STRATA_CHECK(a.input && a.dout, "weight gradients before the input gradients");
  const size_t begin = size_t(chunk_begin_[size_t(a.chunk)]), end = size_t(chunk_begin_[size_t(a.chunk) + 1]);
  const size_t lowest = lowest_[size_t(a.chunk)];
  for (size_t i = end; i-- > begin;) {
    if (i >= lowest && !layers_[i]->is_reshape()) {
      const Tensor& x = i > begin ? a.outs[i - 1] : *a.input;
      const Tensor& dy = i + 1 < end ? a.douts[i + 1] : *a.dout;
      layers_[i]->backward_weight(be, x, a.outs[i], dy, k, accumulate);
    }
    if (on_ready) on_ready(ready_after_[i]);
  }
  a.dout = nullptr;
}

}  // namespace strata
