// The loss head: softmax cross-entropy over a model's logits, the one place the trainer, the
// pipeline's last stage and evaluation compute the loss, its gradient and accuracy counts.
// A sample has `rows_per_sample` rows of `classes` logits: 1 for a classifier, T (one per
// position) for a language model; labels hold one class per row.
#pragma once
#include <cstdint>
#include <utility>

#include "strata/backend.h"
#include "strata/tensor.h"

namespace strata {

class SoftmaxXentHead {
 public:
  SoftmaxXentHead(int classes, int64_t rows_per_sample)
      : classes_(classes), rows_per_sample_(rows_per_sample) {}
  // logits (samples x rows_per_sample, classes). Returns the sum over rows of -log p[label];
  // dlogits (sized here) = (p - onehot) / (global_batch x rows_per_sample), so an allreduce
  // SUM of every rank's gradients is the mean gradient of the global batch.
  double loss_and_gradient(const Backend& be, const Tensor& logits, const int32_t* labels,
                           int64_t samples, int64_t global_batch, Tensor& dlogits);
  // Evaluation: {sum over rows of -log p[label], rows whose argmax is the label}.
  std::pair<double, int64_t> loss_and_correct(const Backend& be, const Tensor& logits,
                                              const int32_t* labels, int64_t samples);
  int64_t rows_per_sample() const { return rows_per_sample_; }

 private:
  int classes_;
  int64_t rows_per_sample_;
  Tensor probs_;  // softmax, needed only until the gradient is formed: one buffer suffices
};

}  // namespace strata
