#include "model/flat_layout.h"

#include <algorithm>
#include <cmath>

#include "model/layer_stack.h"
#include "strata/error.h"
#include "strata/rng.h"

namespace strata {
namespace {

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

FlatLayout::FlatLayout(std::vector<std::unique_ptr<Layer>>& layers, Param* extra, TensorSplit tp)
    : tp_(tp), extra_(extra) {
  int64_t total = 0;
  for (auto& l : layers) total += flat_count(*l);
  block_params_ = total;
  if (extra) total += flat_span(numel(extra->shape));
  values_ = Tensor({total});
  grads_ = Tensor({total});
  host_values_ = values_;  // shares storage until place() moves values_ to a device
  int64_t off = 0, whole_off = 0;
  ready_after_.assign(layers.size(), 0);
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
  for (size_t i = layers.size(); i-- > 0;) {
    for (auto& p : layers[i]->params) {
      p.name = layers[i]->name + "." + p.name;
      bind(p);
    }
    ready_after_[i] = off;
  }
  whole_block_params_ = whole_off;
  for (auto& l : layers)
    for (auto& p : l->params) params_.push_back(&p);
  if (extra) {
    bind(*extra);
    params_.push_back(extra);
  }
}

std::vector<FlatPieces> FlatLayout::norm_ranges() const {
  std::vector<FlatPieces> r;
  int64_t packed_end = -1;  // of the last range
  for (const Param* p : params_) {
    if (p == extra_ || (tp_.rank != 0 && p->split_dim < 0)) continue;
    if (r.empty() || p->packed != packed_end) r.emplace_back();  // not adjacent when packed
    r.back().push_back({p->offset, numel(p->shape)});
    packed_end = p->packed + numel(p->shape);
  }
  return r;
}

int64_t FlatLayout::flat_index(int64_t k) const {
  // The tensor holding packed index k: the last whose packed offset is at most k (at a
  // boundary, the next tensor's start: the padding goes with the tensor before it).
  auto it = std::upper_bound(by_packed_.begin(), by_packed_.end(), k,
                             [](int64_t v, const Param* p) { return v < p->packed; });
  if (it == by_packed_.begin()) return 0;
  const Param* p = *(it - 1);
  if (k >= p->packed + numel(p->shape)) return it == by_packed_.end() ? num_params() : (*it)->offset;
  return p->offset + (k - p->packed);
}

std::vector<int64_t> FlatLayout::flat_counts(const std::vector<int64_t>& packed_counts) const {
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

void FlatLayout::assemble(const std::vector<const float*>& parts, float* whole) const {
  STRATA_CHECK(int(parts.size()) == tp_.size, "{} parts for {} tensor ranks", parts.size(), tp_.size);
  for (const Param* p : params_) {
    if (p == extra_) continue;
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

void FlatLayout::extract(const float* whole, float* mine) const {
  for (const Param* p : params_) {
    if (p == extra_) continue;
    const float* src = whole + p->whole_offset;
    float* dst = mine + p->offset;
    for_each_run(*p, tp_.rank, tp_.size, [&](int64_t at_part, int64_t at_whole, int64_t n) {
      std::copy_n(src + at_whole, n, dst + at_part);
    });
  }
}

void FlatLayout::init(uint64_t seed) {
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
    // Padding rows are zero (the rows before them drew the values an unpadded table does).
    if (p->used_rows > 0) std::fill(v + p->used_rows * (n / p->whole_shape[0]), v + n, 0.0f);
    if (p->split_dim >= 0)
      for_each_run(*p, tp_.rank, tp_.size, [&](int64_t at_part, int64_t at_whole, int64_t k) {
        std::copy_n(v + at_whole, k, p->host + at_part);
      });
  }
}

void FlatLayout::place(const Backend& be) {
  if (values_.memory == be.memory) return;
  values_ = Tensor({host_values_.size()}, *be.memory);
  grads_ = Tensor({host_values_.size()}, *be.memory);
  for (Param* p : params_) {
    p->value = values_.data() + p->offset;
    p->grad = grads_.data() + p->offset;
  }
  push(be);
}

void FlatLayout::rebind_values(Tensor v) {
  STRATA_CHECK(values_.data() == host_values_.data() && v.size() == values_.size() &&
                   reinterpret_cast<uintptr_t>(v.data()) % 256 == 0,
               "rebind_values: values on a device, or a buffer of another size or alignment");
  values_ = host_values_ = std::move(v);
  for (Param* p : params_) p->value = p->host = values_.data() + p->offset;
}

void FlatLayout::rebind_grads(Tensor g) {
  STRATA_CHECK(values_.data() == host_values_.data() && g.size() == grads_.size() &&
                   reinterpret_cast<uintptr_t>(g.data()) % 256 == 0,
               "rebind_grads: gradients on a device, or a buffer of another size or alignment");
  grads_ = std::move(g);
  for (Param* p : params_) p->grad = grads_.data() + p->offset;
}

void FlatLayout::pull(const Backend& be) {
  if (values_.data() != host_values_.data())
    be.download(host_values_.data(), values_.data(), sizeof(float) * size_t(values_.size()));
}

void FlatLayout::push(const Backend& be) {
  if (values_.data() != host_values_.data())
    be.upload(values_.data(), host_values_.data(), sizeof(float) * size_t(values_.size()));
}

}  // namespace strata
