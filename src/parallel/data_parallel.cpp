#include "parallel/data_parallel.h"

#include <chrono>

#include "parallel/zero.h"

namespace strata {

std::vector<int64_t> bucket_bounds(const std::vector<int64_t>& ends, int64_t cap) {
  std::vector<int64_t> bounds = {0};
  for (int64_t e : ends)
    if (e - bounds.back() >= (bounds.size() == 1 ? std::max<int64_t>(1, cap / 8) : cap)) bounds.push_back(e);
  if (!ends.empty() && bounds.back() != ends.back()) bounds.push_back(ends.back());
  return bounds;
}

GradientAllreducer::GradientAllreducer(Comm& comm, const Model& model, Tensor& grads,
                                       double bucket_bytes, bool overlap,
                                       const std::vector<int64_t>* shards)
    : comm_(comm), grads_(grads), overlap_(overlap), scatters_(shards != nullptr) {
  // Parameter boundaries in flat-buffer order (reverse layer order), each tensor with the
  // padding after it (the buckets tile the buffer).
  std::vector<int64_t> ends;
  for (auto* p : model.params()) ends.push_back(p->offset + flat_span(numel(p->shape)));
  std::sort(ends.begin(), ends.end());
  bounds_ = bucket_bounds(ends, std::max<int64_t>(1, int64_t(bucket_bytes / sizeof(float))));
  handles_.assign(bounds_.size(), -1);
  if (shards)
    for (size_t b = 0; b + 1 < bounds_.size(); ++b)
      scatter_.push_back(shard_parts(*shards, bounds_[b], bounds_[b + 1]));
}

void GradientAllreducer::start(size_t b) {
  if (gate_ && !closed_) gate_->close(), closed_ = true;
  float* g = grads_.data() + bounds_[b];
  handles_[b] = !scatters_ || whole(b) ? comm_.start_allreduce_sum(g, bounds_[b + 1] - bounds_[b])
                                       : comm_.start_reduce_scatter_sum(g, scatter_[b]);
  stats_.buckets++;
  stats_.bytes += (bounds_[b + 1] - bounds_[b]) * int64_t(sizeof(float));
}

void GradientAllreducer::on_grads_ready(int64_t ready) {
  if (!overlap_ || !sums()) return;
  auto t0 = std::chrono::steady_clock::now();
  while (next_ + 1 < bounds_.size() && bounds_[next_ + 1] <= ready) start(next_++);
  for (size_t b = 0; b < next_; ++b) comm_.test(handles_[b]);  // drive progress
  // Starting and testing also costs the training thread time: count it as exposed.
  stats_.exposed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradientAllreducer::finish() {
  if (sums()) {
    auto t0 = std::chrono::steady_clock::now();
    while (next_ + 1 < bounds_.size()) start(next_++);
    for (size_t b = 0; b < next_; ++b) comm_.wait(handles_[b]);
    if (closed_) gate_->open(), closed_ = false;
    stats_.exposed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  next_ = 0;
}

}  // namespace strata
