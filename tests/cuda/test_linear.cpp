// linear and linear_relu, forward and backward, CUDA against the CPU: fp32 and bf16, through
// cuBLASLt (bias/ReLU epilogues) and through cublasGemmEx (strata's epilogue kernel), with
// 256-byte aligned buffers and with buffers one float off (4-byte aligned).
//
// Tolerances (norm-wise, see cuda_test_util.h):
//  - fp32 GEMM products 5e-5: both sides sum K <= 784 fp32 products in different orders;
//    the typical difference is ~sqrt(K) ulp of the output's scale (~1e-6). 5e-5 leaves room
//    for split-K orders and stays far below the O(1) of a wrong index or transpose.
//  - bf16 GEMM products 1e-2: inputs rounded to bf16 (relative 2^-9 each) with fp32
//    accumulation. A CPU model of exactly that (bf16-rounded inputs, exact sums) measured
//    2.2e-3..3.0e-3 on these shapes and on the transposed ones (tests' shapes, 5 seeds), so
//    1e-2 is ~3x margin, and still ~100x below a wrong result.
//  - dbias 1e-5 in both precisions: an fp32 reduction over B rows either way (never bf16).
//  - dpre (ReLU's backward) exact: a select, no arithmetic.
#include "cuda_test_util.h"

using namespace strata;
using namespace strata::cuda_test;

namespace {

struct LinearShape {
  int B, I, O;
};

std::string label(const char* op, const LinearShape& s, bool lt, size_t offset) {
  return std::string(op) + " B" + std::to_string(s.B) + " I" + std::to_string(s.I) + " O" +
         std::to_string(s.O) + (lt ? " lt" : " gemmex") + (offset ? " off1" : "");
}

void check_linear(const LinearShape& s, bool bf16, bool lt, size_t off) {
  use_precision(bf16, lt);
  const double tol = bf16 ? 1e-2 : 5e-5, tol_bias = 1e-5;
  const int B = s.B, I = s.I, O = s.O;
  const auto x = random_vector(1, size_t(B) * I), w = random_vector(2, size_t(O) * I);
  const auto bias = random_vector(3, O), dy = random_vector(4, size_t(B) * O);
  const auto dw_prior = random_vector(5, size_t(O) * I), db_prior = random_vector(6, O);

  DeviceBuffer<float> dx_(x, off), dw_(w, off), dbias_(bias, off), ddy(dy, off);
  DeviceBuffer<float> dout(size_t(B) * O, off), dgrad_in(size_t(B) * I, off);
  DeviceBuffer<float> dgrad_w(size_t(O) * I, off), dgrad_b(O, off), ddpre(size_t(B) * O, off);
  std::vector<float> ref_y(size_t(B) * O), ref_dx(size_t(B) * I), ref_dw(size_t(O) * I),
      ref_db(O), ref_dpre(size_t(B) * O);

  // Forward, with and without bias, plain and with ReLU.
  for (bool relu : {false, true})
    for (bool with_bias : {true, false}) {
      const float* b_cpu = with_bias ? bias.data() : nullptr;
      const float* b_gpu = with_bias ? dbias_.get() : nullptr;
      if (relu) {
        cpu::linear_relu_forward(ref_y.data(), x.data(), w.data(), b_cpu, B, I, O);
        cuda::linear_relu_forward(dout.get(), dx_.get(), dw_.get(), b_gpu, B, I, O);
      } else {
        cpu::linear_forward(ref_y.data(), x.data(), w.data(), b_cpu, B, I, O);
        cuda::linear_forward(dout.get(), dx_.get(), dw_.get(), b_gpu, B, I, O);
      }
      const std::string op = std::string(relu ? "linear_relu_forward" : "linear_forward") +
                             (with_bias ? "" : " nobias");
      check_close(label(op.c_str(), s, lt, off), bf16, dout.download(), ref_y, tol);
    }

  // linear_backward: overwrite with all three gradients, then accumulate without dinp.
  cpu::linear_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dy.data(), x.data(), w.data(),
                       B, I, O, false);
  cuda::linear_backward(dgrad_in.get(), dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(),
                        dw_.get(), B, I, O, false);
  check_close(label("linear_backward dinp", s, lt, off), bf16, dgrad_in.download(), ref_dx, tol);
  check_close(label("linear_backward dweight", s, lt, off), bf16, dgrad_w.download(), ref_dw, tol);
  check_close(label("linear_backward dbias", s, lt, off), bf16, dgrad_b.download(), ref_db,
              tol_bias);

  ref_dw = dw_prior;
  ref_db = db_prior;
  dgrad_w.upload(dw_prior);
  dgrad_b.upload(db_prior);
  cpu::linear_backward(nullptr, ref_dw.data(), ref_db.data(), dy.data(), x.data(), w.data(), B, I,
                       O, true);
  cuda::linear_backward(nullptr, dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(), dw_.get(), B,
                        I, O, true);
  check_close(label("linear_backward accumulate dweight", s, lt, off), bf16, dgrad_w.download(),
              ref_dw, tol);
  check_close(label("linear_backward accumulate dbias", s, lt, off), bf16, dgrad_b.download(),
              ref_db, tol_bias);

  // linear_relu_backward from the CPU's forward output (so both sides mask the same elements).
  std::vector<float> y(size_t(B) * O);
  cpu::linear_relu_forward(y.data(), x.data(), w.data(), bias.data(), B, I, O);
  DeviceBuffer<float> dy_out(y, off);
  for (bool accumulate : {false, true}) {
    ref_dw = dw_prior;
    ref_db = db_prior;
    dgrad_w.upload(dw_prior);
    dgrad_b.upload(db_prior);
    cpu::linear_relu_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dy.data(), y.data(),
                              x.data(), w.data(), B, I, O, ref_dpre.data(), accumulate);
    cuda::linear_relu_backward(dgrad_in.get(), dgrad_w.get(), dgrad_b.get(), ddy.get(),
                               dy_out.get(), dx_.get(), dw_.get(), B, I, O, ddpre.get(),
                               accumulate);
    const std::string acc = accumulate ? " accumulate" : "";
    check_equal(label(("linear_relu_backward dpre" + acc).c_str(), s, lt, off), bf16,
                ddpre.download(), ref_dpre);
    check_close(label(("linear_relu_backward dinp" + acc).c_str(), s, lt, off), bf16,
                dgrad_in.download(), ref_dx, tol);
    check_close(label(("linear_relu_backward dweight" + acc).c_str(), s, lt, off), bf16,
                dgrad_w.download(), ref_dw, tol);
    check_close(label(("linear_relu_backward dbias" + acc).c_str(), s, lt, off), bf16,
                dgrad_b.download(), ref_db, tol_bias);
  }

  // Only the ReLU's backward wanted (no bias gradient, no dinp): dpre still written.
  cpu::linear_relu_backward(nullptr, ref_dw.data(), nullptr, dy.data(), y.data(), x.data(),
                            w.data(), B, I, O, ref_dpre.data(), false);
  cuda::linear_relu_backward(nullptr, dgrad_w.get(), nullptr, ddy.get(), dy_out.get(), dx_.get(),
                             dw_.get(), B, I, O, ddpre.get(), false);
  check_equal(label("linear_relu_backward dpre (no dbias)", s, lt, off), bf16, ddpre.download(),
              ref_dpre);
  check_close(label("linear_relu_backward dweight (no dbias)", s, lt, off), bf16,
              dgrad_w.download(), ref_dw, tol);
}

}  // namespace

TEST_CASE("linear and linear_relu forward/backward match the CPU", "[linear]") {
  // {1024, 33, 10}: a bias gradient long enough to be summed in chunks (two passes).
  const LinearShape shapes[] = {{64, 300, 70}, {128, 784, 256}, {1, 17, 5}, {300, 64, 10},
                                {1024, 33, 10}};
  for (const LinearShape& s : shapes)
    for (bool bf16 : {false, true})
      for (bool lt : {true, false})
        for (size_t off : {size_t(0), size_t(1)}) {
          CAPTURE(s.B, s.I, s.O, bf16, lt, off);
          check_linear(s, bf16, lt, off);
        }
}

TEST_CASE("linear backward of an empty batch zeroes or keeps the parameter gradients",
          "[linear]") {
  for (bool bf16 : {false, true}) {
    use_precision(bf16);
    const int I = 7, O = 5;
    const auto w = random_vector(1, size_t(O) * I), prior = random_vector(2, size_t(O) * I);
    const auto db_prior = random_vector(3, O);
    DeviceBuffer<float> dw_(w), dgrad_w(prior), dgrad_b(db_prior), dx_(1), ddy(1);
    cuda::linear_backward(nullptr, dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(), dw_.get(),
                          0, I, O, true);
    check_equal("linear_backward B0 accumulate dweight (kept)", bf16, dgrad_w.download(), prior);
    check_equal("linear_backward B0 accumulate dbias (kept)", bf16, dgrad_b.download(), db_prior);
    cuda::linear_backward(nullptr, dgrad_w.get(), dgrad_b.get(), ddy.get(), dx_.get(), dw_.get(),
                          0, I, O, false);
    check_equal("linear_backward B0 dweight (zeroed)", bf16, dgrad_w.download(),
                std::vector<float>(size_t(O) * I, 0.f));
    check_equal("linear_backward B0 dbias (zeroed)", bf16, dgrad_b.download(),
                std::vector<float>(O, 0.f));
  }
}
