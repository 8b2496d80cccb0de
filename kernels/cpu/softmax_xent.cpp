// Softmax + cross-entropy, fused: the loss comes from log-sum-exp of the logits (stable for
// any magnitude), and backward needs only the probabilities.
#include <cmath>

#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {
void check_label(int32_t label, int row, int C) {
  if (label < 0 || label >= C)
    fail_input("label {} of batch row {} is outside [0, {})", label, row, C);
}
}  // namespace

// logits (B,C), labels (B) -> probs (B,C); returns sum_b -log softmax(logits_b)[label_b].
double softmax_xent_forward(float* probs, const float* logits, const int32_t* labels, int B,
                            int C) {
  double loss = 0.0;
  for (int b = 0; b < B; ++b) {
    const float* x = logits + int64_t(b) * C;
    float* p = probs + int64_t(b) * C;
    check_label(labels[b], b, C);
    float mx = x[0];
    for (int c = 1; c < C; ++c) mx = x[c] > mx ? x[c] : mx;
    float sum = 0.f;
    for (int c = 0; c < C; ++c) {
      p[c] = std::exp(x[c] - mx);  // <= 1: no overflow
      sum += p[c];
    }
    const float inv = 1.f / sum;
    for (int c = 0; c < C; ++c) p[c] *= inv;
    // -log p[label] = log(sum exp(x - mx)) - (x[label] - mx), in double for the batch total.
    loss += std::log(double(sum)) - (double(x[labels[b]]) - double(mx));
  }
  return loss;
}

// probs (B,C), labels (B) -> dlogits (B,C) = (probs - onehot(labels)) * scale
void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* labels, int B,
                           int C, float scale) {
  for (int b = 0; b < B; ++b) {
    const float* p = probs + int64_t(b) * C;
    float* d = dlogits + int64_t(b) * C;
    check_label(labels[b], b, C);
    for (int c = 0; c < C; ++c) d[c] = p[c] * scale;
    d[labels[b]] = (p[labels[b]] - 1.f) * scale;
  }
}

// logits (B,C), labels (B) -> number of rows whose first maximum is at the label.
int64_t count_correct(const float* logits, const int32_t* labels, int B, int C) {
  int64_t correct = 0;
  for (int b = 0; b < B; ++b) {
    const float* x = logits + int64_t(b) * C;
    int best = 0;
    for (int c = 1; c < C; ++c)
      if (x[c] > x[best]) best = c;
    correct += best == labels[b];
  }
  return correct;
}

}  // namespace strata::cpu
