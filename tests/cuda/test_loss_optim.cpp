// softmax cross-entropy, count_correct, SGD, AdamW, sum_squares: CUDA against the CPU (fp32
// mode; none of these changes with the GEMM precision).
//
// Tolerances:
//  - probs 1e-5 norm-wise: expf within 2 ulp (CUDA) vs 1 ulp (glibc) and the row sum in
//    another order: a few ulp per element.
//  - loss (sum over the batch) 1e-6 relative: per row the log of a float sum that differs by a
//    few ulp (~1e-7 absolute), summed in double.
//  - softmax backward, count_correct: exact (the same single roundings; integer count).
//  - SGD, AdamW 1e-6 norm-wise after several steps: the CUDA kernels use the CPU's operations in
//    its order without FMA contraction, so the results are expected to be bitwise equal (the
//    "unequal" column); the tolerance leaves room only for a last-place difference.
//  - sum_squares 1e-12 relative: double accumulation in two different orders.
#include <stdexcept>

#include "cuda_test_util.h"

using namespace strata;
using namespace strata::cuda_test;

TEST_CASE("softmax_xent forward/backward and count_correct match the CPU", "[softmax_xent]") {
  use_precision(false);
  for (int C : {10, 100, 1000}) {
    CAPTURE(C);
    const int B = 37;
    auto logits = random_vector(71, size_t(B) * C, -5.f, 5.f);
    for (int c = 0; c < C; ++c) logits[size_t(1) * C + c] += 1e4f;  // large: needs the max shift
    Rng rng(72);
    std::vector<int32_t> labels(B);
    for (auto& l : labels) l = int32_t(rng.below(uint64_t(C)));
    std::vector<float> ref_p(size_t(B) * C), ref_d(size_t(B) * C);
    const double ref_loss = cpu::softmax_xent_forward(ref_p.data(), logits.data(), labels.data(), B, C);
    const float scale = 1.f / 256.f;
    cpu::softmax_xent_backward(ref_d.data(), ref_p.data(), labels.data(), B, C, scale);

    DeviceBuffer<float> dlogits(logits), dprobs(size_t(B) * C), dgrad(size_t(B) * C);
    DeviceBuffer<int32_t> dlabels(labels);
    const double loss = cuda::softmax_xent_forward(dprobs.get(), dlogits.get(), dlabels.get(), B, C);
    const std::string tag = "softmax_xent C=" + std::to_string(C);
    check_close(tag + " forward probs", false, dprobs.download(), ref_p, 1e-5);
    check_scalar(tag + " forward loss (sum)", false, loss, ref_loss, 1e-6);
    // Backward from the CPU's probabilities: the same single roundings on both sides.
    DeviceBuffer<float> dref_p(ref_p);
    cuda::softmax_xent_backward(dgrad.get(), dref_p.get(), dlabels.get(), B, C, scale);
    check_equal(tag + " backward", false, dgrad.download(), ref_d);

    // count_correct: ties (first max wins), a NaN in a row, a NaN at index 0.
    std::vector<float> q(size_t(B) * C);
    for (auto& v : q) v = float(rng.below(4));
    q[size_t(3) * C + 1] = NAN;
    q[size_t(4) * C] = NAN;
    for (int b = 0; b < B; b += 3) labels[b] = 0;  // some rows right by the tie rule
    dlabels.upload(labels);
    DeviceBuffer<float> dq(q);
    const int64_t ref_q = cpu::count_correct(q.data(), labels.data(), B, C);
    const int64_t got_q = cuda::count_correct(dq.get(), dlabels.get(), B, C);
    check_equal(tag + " count_correct (ties, NaN)", false, std::vector<int64_t>{got_q},
                std::vector<int64_t>{ref_q});
    const int64_t ref_c = cpu::count_correct(logits.data(), labels.data(), B, C);
    const int64_t got_c = cuda::count_correct(dlogits.get(), dlabels.get(), B, C);
    check_equal(tag + " count_correct", false, std::vector<int64_t>{got_c},
                std::vector<int64_t>{ref_c});
  }

  // A label outside [0, C) is an error, as on the CPU.
  const int B = 4, C = 10;
  const auto logits = random_vector(73, size_t(B) * C);
  DeviceBuffer<float> dlogits(logits), dprobs(size_t(B) * C);
  DeviceBuffer<int32_t> dlabels(std::vector<int32_t>{1, 2, 10, 3});
  CHECK_THROWS_AS(cuda::softmax_xent_forward(dprobs.get(), dlogits.get(), dlabels.get(), B, C),
                  std::runtime_error);
}

TEST_CASE("sgd_update matches the CPU over several steps", "[optimizer]") {
  use_precision(false);
  const size_t n = 10007;
  struct Case {
    float momentum, wd;
    bool nesterov, with_buffer;
  };
  const Case cases[] = {{0.9f, 0.f, false, true}, {0.9f, 1e-2f, false, true},
                        {0.9f, 1e-2f, true, true}, {0.f, 1e-2f, false, false},
                        {0.5f, 0.f, false, false}};  // momentum without a buffer: plain step
  for (const Case& c : cases) {
    CAPTURE(c.momentum, c.wd, c.nesterov, c.with_buffer);
    auto p = random_vector(81, n);
    std::vector<float> buf(n, 0.f);
    DeviceBuffer<float> dp(p), dbuf(buf), dg(n);
    for (int step = 0; step < 3; ++step) {
      const auto g = random_vector(82 + step, n);
      dg.upload(g);
      cpu::sgd_update(p.data(), g.data(), c.with_buffer ? buf.data() : nullptr, int64_t(n), 0.05f,
                      c.momentum, c.wd, c.nesterov, step == 0);
      cuda::sgd_update(dp.get(), dg.get(), c.with_buffer ? dbuf.get() : nullptr, int64_t(n), 0.05f,
                       c.momentum, c.wd, c.nesterov, step == 0);
    }
    char tag[96];
    std::snprintf(tag, sizeof tag, "sgd m=%.1f wd=%g%s%s 3 steps", c.momentum, c.wd,
                  c.nesterov ? " nesterov" : "", c.with_buffer ? "" : " no buffer");
    check_close(std::string(tag) + " param", false, dp.download(), p, 1e-6);
    if (c.with_buffer) check_close(std::string(tag) + " momentum", false, dbuf.download(), buf, 1e-6);
  }
}

TEST_CASE("adamw_update matches the CPU over several steps", "[optimizer]") {
  use_precision(false);
  const size_t n = 10007;
  struct Case {
    float lr, beta1, beta2, eps, wd;
  };
  // beta1 0.3: the lerp weight 1 - beta1 >= 0.5 takes torch.lerp's other branch.
  const Case cases[] = {{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f}, {3e-2f, 0.3f, 0.99f, 1e-6f, 0.f}};
  for (const Case& c : cases) {
    CAPTURE(c.lr, c.beta1, c.beta2, c.eps, c.wd);
    auto p = random_vector(91, n);
    std::vector<float> m(n, 0.f), v(n, 0.f);
    DeviceBuffer<float> dp(p), dm(m), dv(v), dg(n);
    for (int64_t t = 1; t <= 5; ++t) {
      const auto g = random_vector(uint64_t(92 + t), n);
      dg.upload(g);
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), int64_t(n), c.lr, c.beta1, c.beta2,
                        c.eps, c.wd, t);
      cuda::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), int64_t(n), c.lr, c.beta1,
                         c.beta2, c.eps, c.wd, t);
    }
    char tag[96];
    std::snprintf(tag, sizeof tag, "adamw lr=%g b1=%g wd=%g 5 steps", c.lr, c.beta1, c.wd);
    check_close(std::string(tag) + " param", false, dp.download(), p, 1e-6);
    check_close(std::string(tag) + " m", false, dm.download(), m, 1e-6);
    check_close(std::string(tag) + " v", false, dv.download(), v, 1e-6);
  }
}

TEST_CASE("sum_squares matches the CPU", "[optimizer]") {
  use_precision(false);
  for (size_t n : {size_t(1), size_t(1000), (size_t(1) << 20) + 5, size_t(5) << 20}) {
    const auto x = random_vector(101, n);
    DeviceBuffer<float> dx(x);
    check_scalar("sum_squares n=" + std::to_string(n), false, cuda::sum_squares(dx.get(), int64_t(n)),
                 cpu::sum_squares(x.data(), int64_t(n)), 1e-12);
  }
  CHECK(cuda::sum_squares(nullptr, 0) == 0.0);
}
