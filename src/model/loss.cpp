#include "model/loss.h"

namespace strata {

double SoftmaxXentHead::loss_and_gradient(const Backend& be, const Tensor& logits,
                                          const int32_t* labels, int64_t samples,
                                          int64_t global_batch, Tensor& dlogits) {
  probs_.resize(logits.shape, *be.memory);
  dlogits.resize(logits.shape, *be.memory);
  const int rows = int(samples * rows_per_sample_);
  const double loss =
      be.softmax_xent_forward(probs_.data(), logits.data(), labels, rows, classes_);
  be.softmax_xent_backward(dlogits.data(), probs_.data(), labels, rows, classes_,
                           1.0f / float(global_batch * rows_per_sample_));
  return loss;
}

std::pair<double, int64_t> SoftmaxXentHead::loss_and_correct(const Backend& be,
                                                             const Tensor& logits,
                                                             const int32_t* labels,
                                                             int64_t samples) {
  probs_.resize(logits.shape, *be.memory);
  const int rows = int(samples * rows_per_sample_);
  return {be.softmax_xent_forward(probs_.data(), logits.data(), labels, rows, classes_),
          be.count_correct(logits.data(), labels, rows, classes_)};
}

}  // namespace strata
