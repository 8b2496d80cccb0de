// Softmax cross-entropy (forward, backward) and count_correct.
//
// Tolerances:
//  - probs 1e-5: expf within 2 ulp (CUDA) against 1 ulp (glibc) and the row sum in another
//    order: a few ulp per element.
//  - loss (the sum over the batch) 1e-6 relative: per row the log of a float sum that differs
//    by a few ulp (~1e-7 absolute), summed in double.
//  - backward exact (the same single roundings, from the reference's probs); count_correct
//    exact (an integer).
// The CPU kernel's own tests at the end ([cpu_kernel], cpu_kernel.h); the one against the
// direct formula and the finite-difference check share their inputs (kCpuXent).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

struct XentShape {
  int B, C;
};
// C of MNIST, of a byte vocabulary and beyond one block's width; one row; an empty batch.
const XentShape kShapes[] = {{37, 10}, {37, 100}, {37, 1000}, {1, 7}, {0, 10}};
constexpr float kScale = 1.f / 256.f;

// The CPU kernel's inputs: against the direct formula and by finite differences.
constexpr XentShape kCpuXent{5, 7};
std::vector<float> cpu_xent_logits() {
  return random_vector(8, size_t(kCpuXent.B) * kCpuXent.C, -3.f, 3.f);
}
std::vector<int32_t> cpu_xent_labels() { return random_ints(9, size_t(kCpuXent.B), kCpuXent.C); }

// Uniform in [-5, 5], row 1 shifted by 1e4 (a softmax without the max subtracted overflows).
std::vector<float> xent_logits(const XentShape& s) {
  auto logits = random_vector(71, size_t(s.B) * s.C, -5.f, 5.f);
  if (s.B > 1)
    for (int c = 0; c < s.C; ++c) logits[size_t(s.C) + c] += 1e4f;
  return logits;
}

// A label outside [0, C) is an error on every backend (a GPU finds it in its reduction).
void check_bad_label() {
  const int B = 4, C = 10;
  Tensor logits({B, C}), labels({B});
  const std::vector<int32_t> bad = {1, 2, 10, 3};
  std::copy(bad.begin(), bad.end(), labels.i32());
  for (const Backend* be : {&reference(), &select_target(Precision::fp32)}) {
    const Tensor x = to_backend(*be, logits), lab = to_backend(*be, labels);
    Tensor probs({B, C}, *be->memory);
    INFO("softmax_xent_forward with label 10 of C 10 on " << be->name);
    CHECK_THROWS_AS(be->softmax_xent_forward(probs.data(), x.data(), lab.i32(), B, C),
                    std::runtime_error);
  }
}

}  // namespace

void check_softmax_xent_forward() {
  for (const XentShape& s : kShapes) {
    OpCase c(fmt::format("softmax_xent_forward B{} C{}", s.B, s.C));
    const F32 logits = c.in(xent_logits(s));
    const I32 labels = c.in(random_ints(72, size_t(s.B), s.C));
    const F32 probs = c.out("probs", size_t(s.B) * s.C, Tol::close(1e-5));
    c.run(
        [&](const Backend& be, const Ptrs& p) {
          return be.softmax_xent_forward(p[probs], p[logits], p[labels], s.B, s.C);
        },
        Tol::close(1e-6));
  }
  check_bad_label();
}

// From the reference's probabilities: the same single roundings on both sides.
void check_softmax_xent_backward() {
  for (const XentShape& s : kShapes) {
    const auto logits = xent_logits(s);
    const auto labels = random_ints(72, size_t(s.B), s.C);
    std::vector<float> probs(logits.size());
    reference().softmax_xent_forward(probs.data(), logits.data(), labels.data(), s.B, s.C);
    OpCase c(fmt::format("softmax_xent_backward B{} C{}", s.B, s.C));
    const F32 p_in = c.in(probs), dlogits = c.out("dlogits", probs.size(), Tol::exact());
    const I32 lab = c.in(labels);
    c.run([&](const Backend& be, const Ptrs& p) {
      be.softmax_xent_backward(p[dlogits], p[p_in], p[lab], s.B, s.C, kScale);
    });
  }
}

// On the logits, and on values of four levels (ties: the first maximum wins) with a NaN inside
// row 3 and at index 0 of row 4, every third label 0 (some rows right by the tie rule).
void check_count_correct() {
  for (const XentShape& s : kShapes)
    for (bool ties : {false, true}) {
      auto x = xent_logits(s);
      auto labels = random_ints(72, size_t(s.B), s.C);
      if (ties) {
        Rng rng(74);
        for (auto& v : x) v = float(rng.below(4));
        if (s.B > 4) x[size_t(3) * s.C + 1] = NAN, x[size_t(4) * s.C] = NAN;
        for (int b = 0; b < s.B; b += 3) labels[size_t(b)] = 0;
      }
      OpCase c(fmt::format("count_correct B{} C{}{}", s.B, s.C, ties ? " ties, NaN" : ""));
      const F32 logits = c.in(x);
      const I32 lab = c.in(labels);
      c.run([&](const Backend& be, const Ptrs& p) {
        return be.count_correct(p[logits], p[lab], s.B, s.C);
      });
    }
}

// dlogits of the mean-scaled loss: L = scale * sum_b -log softmax(logits_b)[label_b].
void fd_softmax_xent_backward() {
  const int B = kCpuXent.B, C = kCpuXent.C;
  const float scale = 0.25f;
  const Backend& cpu = reference();
  auto logits = cpu_xent_logits();
  const auto labels = cpu_xent_labels();
  std::vector<float> probs(logits.size()), dl = nan_vector(logits.size());
  cpu.softmax_xent_forward(probs.data(), logits.data(), labels.data(), B, C);
  cpu.softmax_xent_backward(dl.data(), probs.data(), labels.data(), B, C, scale);
  auto loss = [&] {
    std::vector<float> p(logits.size());
    return scale * cpu.softmax_xent_forward(p.data(), logits.data(), labels.data(), B, C);
  };
  Rng rng(10);
  check_grad("fd softmax_xent_backward B5 C7: dlogits", logits, dl, loss, rng);
}

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

using namespace strata::cpu;

// (Backward, on these inputs: "softmax_xent_backward vs finite differences".)
TEST_CASE("softmax_xent matches the direct formula", "[cpu_kernel][xent]") {
  const int B = kCpuXent.B, C = kCpuXent.C;
  const Vec logits = cpu_xent_logits();
  const std::vector<int32_t> labels = cpu_xent_labels();
  Vec probs = nan_vec(B * C);
  const double loss = softmax_xent_forward(probs.data(), logits.data(), labels.data(), B, C);
  double want = 0;
  std::vector<double> want_p(B * C);
  for (int b = 0; b < B; ++b) {
    double z = 0;
    for (int c = 0; c < C; ++c) z += std::exp(double(logits[b * C + c]));
    for (int c = 0; c < C; ++c) want_p[b * C + c] = std::exp(double(logits[b * C + c])) / z;
    want -= std::log(want_p[b * C + labels[b]]);
  }
  // fp32 exp/sum of 7 terms: probabilities within a few ulp (~1e-7); the loss is summed in
  // double from fp32 log-sum-exp pieces, relative error ~1e-7.
  CHECK(loss == Approx(want).epsilon(1e-6));
  check_close("probs", probs, want_p, 1e-6);
}

TEST_CASE("softmax_xent is stable for large logits", "[cpu_kernel][xent]") {
  const Vec logits = {1000.f, 0.f, -1000.f, 500.f, 500.f, 500.f};
  const std::vector<int32_t> labels = {1, 2};
  Vec probs(6);
  const double loss = softmax_xent_forward(probs.data(), logits.data(), labels.data(), 2, 3);
  CHECK(loss == Approx(1000.0 + std::log(3.0)).epsilon(1e-9));  // exact up to double rounding
  CHECK(probs[0] == 1.f);
  CHECK(probs[1] == 0.f);
  CHECK(probs[3] == Approx(1.0 / 3).epsilon(1e-6));
}

TEST_CASE("count_correct takes the first maximum", "[cpu_kernel][xent]") {
  const Vec logits = {0, 2, 1,   // argmax 1
                      3, 3, 0,   // tie: first (0)
                      1, 0, 5};  // argmax 2
  CHECK(count_correct(logits.data(), std::vector<int32_t>{1, 0, 2}.data(), 3, 3) == 3);
  CHECK(count_correct(logits.data(), std::vector<int32_t>{1, 1, 0}.data(), 3, 3) == 1);
}

}  // namespace strata::optest
