#include "model/model.h"

#include <chrono>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {

Model::Model(const ModelSpec& spec, Shape input_shape, int classes, LayerRange stage,
             TensorSplit tp)
    : Model(spec, std::move(input_shape), classes, std::vector<LayerRange>{stage}, tp) {}

Model::Model(const ModelSpec& spec, Shape input_shape, int classes, std::vector<LayerRange> chunks,
             TensorSplit tp)
    : spec_(spec), input_shape_(std::move(input_shape)), classes_(classes) {
  LayerStack stack = build_layers(spec, input_shape_, classes, tp);
  std::vector<int64_t> whole_flat;
  for (auto& l : stack.layers) whole_flat.push_back(whole_flat_count(*l));
  partition_ = Partition(std::move(chunks), whole_flat);
  tied_ = TiedTable(stack.layers, partition_);
  for (int c = 0; c < partition_.chunks(); ++c)
    for (int i = partition_.range(c).first; i < partition_.range(c).last; ++i) {
      layers_.push_back(std::move(stack.layers[size_t(i)]));
      in_shapes_.push_back(stack.shapes[size_t(i)]);
      out_shapes_.push_back(stack.shapes[size_t(i) + 1]);
    }
  for (size_t c = 0; c < size_t(partition_.chunks()); ++c) lowest_.push_back(lowest_with_input_grad(c));
  layout_ = FlatLayout(layers_, tied_.copy(), tp);
  tied_.tie(layers_);
  slot(0);
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
  for (int i = partition_.begin(a.chunk); i < partition_.end(a.chunk); ++i)
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
  return s + fmt::format("  total {} parameters, {:.2f} MFLOP per sample forward", layout_.num_params(),
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

const Tensor& Model::forward(const Backend& be, const Tensor& x, const StepInfo& s) {
  STRATA_CHECK(0 <= s.chunk && s.chunk < chunks(), "chunk {} of {}", s.chunk, chunks());
  Activations& a = slot(s.slot);
  a.input = &x;
  a.chunk = s.chunk;
  const int64_t b = x.dim(0);
  const Tensor* in = &x;
  for (size_t i = size_t(partition_.begin(s.chunk)); i < size_t(partition_.end(s.chunk)); ++i) {
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
  const size_t begin = size_t(partition_.begin(int(chunk))), end = size_t(partition_.end(int(chunk)));
  if (partition_.needs_input_grad(int(chunk))) return begin;
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
  const size_t begin = size_t(partition_.begin(a.chunk)), end = size_t(partition_.end(a.chunk));
  const bool input_grad = partition_.needs_input_grad(a.chunk);
  const size_t lowest = lowest_[size_t(a.chunk)];
  for (size_t i = end; i-- > begin;) {
    if (i < lowest) {
      if (on_ready) on_ready(layout_.ready_after(i));
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
    if (on_ready) on_ready(layout_.ready_after(i));
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
  const size_t begin = size_t(partition_.begin(a.chunk)), end = size_t(partition_.end(a.chunk));
  const size_t lowest = lowest_[size_t(a.chunk)];
  for (size_t i = end; i-- > begin;) {
    if (i >= lowest && !layers_[i]->is_reshape()) {
      const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      const Tensor& x = i > begin ? a.outs[i - 1] : *a.input;
      const Tensor& dy = i + 1 < end ? a.douts[i + 1] : *a.dout;
      layers_[i]->backward_weight(be, x, a.outs[i], dy, k, accumulate);
      if (profile_) {
        be.synchronize();
        (*profile_)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (on_ready) on_ready(layout_.ready_after(i));
  }
  a.dout = nullptr;
}

}  // namespace strata
