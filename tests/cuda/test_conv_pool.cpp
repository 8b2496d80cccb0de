// conv2d (cuDNN) and maxpool2d (strata's kernels), CUDA against the CPU.
//
// Tolerances (norm-wise, see cuda_test_util.h):
//  - conv fp32 1e-4: sums of C*KH*KW (forward, dinp) or B*OH*OW (dweight, up to 32768) fp32
//    products in other orders, and cuDNN may pick a Winograd or FFT algorithm whose transforms
//    add their own rounding (~1e-6..1e-5 relative). 1e-4 still fails any indexing error.
//  - conv bf16 1.5e-2: input, weight and dout rounded to bf16, fp32 accumulation, and the
//    result rounded to bf16 once more (cuDNN's legacy API writes y in the input type; see
//    conv.cu). A CPU model of exactly that measured 3.2e-3..4.4e-3 on GEMMs of these sizes;
//    1.5e-2 is ~3.5x margin.
//  - dbias 1e-5 in both precisions: an fp32 sum over B*OH*OW either way.
//  - maxpool: exact (out, argmax, dinp): a max involves no rounding, and backward adds the
//    same values in the CPU's order.
#include "cuda_test_util.h"

using namespace strata;
using namespace strata::cuda_test;

namespace {

std::string label(const char* op, const Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %dx%dx%dx%d oc%d k%dx%d s%d p%d", op, s.B, s.C, s.H, s.W,
                s.OC, s.KH, s.KW, s.stride, s.pad);
  return buf;
}

void check_conv(const Conv2dShape& s, bool bf16) {
  use_precision(bf16);
  const double tol = bf16 ? 1.5e-2 : 1e-4, tol_bias = 1e-5;
  const size_t n_in = size_t(s.B) * s.C * s.H * s.W, n_w = size_t(s.OC) * s.C * s.KH * s.KW;
  const size_t n_out = size_t(s.B) * s.OC * s.OH() * s.OW();
  const auto x = random_vector(11, n_in), w = random_vector(12, n_w), bias = random_vector(13, s.OC);
  const auto dy = random_vector(14, n_out), dw_prior = random_vector(15, n_w);
  const auto db_prior = random_vector(16, s.OC);

  std::vector<float> cpu_scratch(size_t(cpu::conv2d_scratch_size(s)));
  const int64_t scratch_floats = cuda::conv2d_scratch_size(s);
  INFO("cuda scratch floats " << scratch_floats);
  DeviceBuffer<float> scratch{size_t(scratch_floats)};
  DeviceBuffer<float> dx_(x), dw_(w), dbias_(bias), ddy(dy), dout(n_out), dgrad_in(n_in);
  DeviceBuffer<float> dgrad_w(n_w), dgrad_b(size_t(s.OC));
  std::vector<float> ref_y(n_out), ref_dx(n_in), ref_dw(n_w), ref_db(s.OC);

  for (bool with_bias : {true, false}) {
    cpu::conv2d_forward(ref_y.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, s,
                        cpu_scratch.data());
    cuda::conv2d_forward(dout.get(), dx_.get(), dw_.get(), with_bias ? dbias_.get() : nullptr, s,
                         scratch.get());
    check_close(label(with_bias ? "conv2d_forward" : "conv2d_forward nobias", s), bf16,
                dout.download(), ref_y, tol);
  }

  cpu::conv2d_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dy.data(), x.data(), w.data(),
                       s, cpu_scratch.data(), false);
  cuda::conv2d_backward(dgrad_in.get(), dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(),
                        dw_.get(), s, scratch.get(), false);
  check_close(label("conv2d_backward dinp", s), bf16, dgrad_in.download(), ref_dx, tol);
  check_close(label("conv2d_backward dweight", s), bf16, dgrad_w.download(), ref_dw, tol);
  check_close(label("conv2d_backward dbias", s), bf16, dgrad_b.download(), ref_db, tol_bias);

  // Accumulate into earlier gradients, dinp not wanted.
  ref_dw = dw_prior;
  ref_db = db_prior;
  dgrad_w.upload(dw_prior);
  dgrad_b.upload(db_prior);
  cpu::conv2d_backward(nullptr, ref_dw.data(), ref_db.data(), dy.data(), x.data(), w.data(), s,
                       cpu_scratch.data(), true);
  cuda::conv2d_backward(nullptr, dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(), dw_.get(), s,
                        scratch.get(), true);
  check_close(label("conv2d_backward accumulate dweight", s), bf16, dgrad_w.download(), ref_dw,
              tol);
  check_close(label("conv2d_backward accumulate dbias", s), bf16, dgrad_b.download(), ref_db,
              tol_bias);

  // Only dinp (a frozen layer's input gradient).
  cpu::conv2d_backward(ref_dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), s,
                       cpu_scratch.data(), false);
  cuda::conv2d_backward(dgrad_in.get(), nullptr, nullptr, ddy.get(), dx_.get(), dw_.get(), s,
                        scratch.get(), false);
  check_close(label("conv2d_backward dinp only", s), bf16, dgrad_in.download(), ref_dx, tol);
}

}  // namespace

TEST_CASE("conv2d forward/backward match the CPU", "[conv]") {
  const Conv2dShape shapes[] = {
      {4, 3, 17, 17, 8, 3, 3, 1, 1},    // stride 1, pad 1 ("same"), odd size
      {3, 8, 16, 16, 16, 3, 3, 2, 0},   // stride 2, no padding
      {2, 16, 9, 11, 5, 5, 3, 1, 2},    // rectangular image and kernel, pad 2
      {128, 4, 16, 16, 8, 3, 3, 1, 1},  // a bias gradient summed in chunks (two passes)
  };
  for (const auto& s : shapes)
    for (bool bf16 : {false, true}) {
      CAPTURE(s.B, s.C, s.H, s.W, s.OC, s.KH, s.KW, s.stride, s.pad, bf16);
      check_conv(s, bf16);
    }
}

TEST_CASE("conv2d backward of an empty batch zeroes or keeps the parameter gradients", "[conv]") {
  use_precision(false);
  const Conv2dShape s{0, 3, 8, 8, 4, 3, 3, 1, 1};
  const size_t n_w = size_t(s.OC) * s.C * s.KH * s.KW;
  const auto prior = random_vector(1, n_w), db_prior = random_vector(2, s.OC);
  DeviceBuffer<float> dgrad_w(prior), dgrad_b(db_prior), w(n_w), dummy(1);
  cuda::conv2d_backward(nullptr, dgrad_w.get(), dgrad_b.get(), dummy.get(), dummy.get(), w.get(),
                        s, nullptr, true);
  check_equal("conv2d_backward B0 accumulate dweight (kept)", false, dgrad_w.download(), prior);
  check_equal("conv2d_backward B0 accumulate dbias (kept)", false, dgrad_b.download(), db_prior);
  cuda::conv2d_backward(nullptr, dgrad_w.get(), dgrad_b.get(), dummy.get(), dummy.get(), w.get(),
                        s, nullptr, false);
  check_equal("conv2d_backward B0 dweight (zeroed)", false, dgrad_w.download(),
              std::vector<float>(n_w, 0.f));
  check_equal("conv2d_backward B0 dbias (zeroed)", false, dgrad_b.download(),
              std::vector<float>(size_t(s.OC), 0.f));
}

TEST_CASE("maxpool2d forward (values and argmax) and backward equal the CPU's", "[pool]") {
  struct PoolShape {
    int B, C, H, W, k, st;
  };
  const PoolShape shapes[] = {
      {2, 3, 8, 8, 2, 2},   // the common 2x2/2 (the CPU's SSE path)
      {2, 3, 7, 9, 2, 2},   // odd sizes: a last row and column outside every window
      {2, 2, 9, 9, 3, 2},   // overlapping windows: backward adds up
      {1, 2, 6, 7, 3, 3},   // k = st = 3
  };
  for (const auto& s : shapes)
    for (bool with_nan : {false, true}) {
      CAPTURE(s.B, s.C, s.H, s.W, s.k, s.st, with_nan);
      use_precision(false);
      const int OH = (s.H - s.k) / s.st + 1, OW = (s.W - s.k) / s.st + 1;
      const size_t n_in = size_t(s.B) * s.C * s.H * s.W, n_out = size_t(s.B) * s.C * OH * OW;
      // Five levels only: many ties inside windows, so "first max wins" is exercised.
      Rng rng(21);
      std::vector<float> x(n_in);
      for (auto& v : x) v = float(rng.below(5)) - 2.f;
      if (with_nan)  // a NaN wins its window; of two, the later one (take_max's rule)
        for (size_t i = 0; i < n_in; i += 13) x[i] = NAN;
      const auto dy = random_vector(22, n_out);

      std::vector<float> ref_y(n_out), ref_dx(n_in);
      std::vector<int32_t> ref_am(n_out);
      cpu::maxpool2d_forward(ref_y.data(), ref_am.data(), x.data(), s.B, s.C, s.H, s.W, s.k, s.st);
      cpu::maxpool2d_backward(ref_dx.data(), dy.data(), ref_am.data(), s.B, s.C, s.H, s.W, s.k,
                              s.st);

      DeviceBuffer<float> dx_(x), dout(n_out), ddy(dy), dgrad_in(n_in);
      DeviceBuffer<int32_t> dam(n_out), ref_am_dev(ref_am);
      cuda::maxpool2d_forward(dout.get(), dam.get(), dx_.get(), s.B, s.C, s.H, s.W, s.k, s.st);
      // Backward from the CPU's argmax, so a forward mismatch is not reported twice.
      cuda::maxpool2d_backward(dgrad_in.get(), ddy.get(), ref_am_dev.get(), s.B, s.C, s.H, s.W,
                               s.k, s.st);
      char op[96];
      std::snprintf(op, sizeof op, "maxpool2d %dx%d k%d s%d%s", s.H, s.W, s.k, s.st,
                    with_nan ? " nan" : "");
      check_equal(std::string(op) + " forward out", false, dout.download(), ref_y);
      check_equal(std::string(op) + " forward argmax", false, dam.download(), ref_am);
      check_equal(std::string(op) + " backward dinp", false, dgrad_in.download(), ref_dx);
    }
}
