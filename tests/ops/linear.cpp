// linear and linear_relu, forward and backward: fp32 and bf16; on a CUDA backend through
// cuBLASLt (bias/ReLU epilogues) and through cublasGemmEx with strata's epilogue kernel
// (STRATA_CUBLASLT=0); with 64-byte aligned buffers and with buffers one float off.
//
// Tolerances:
//  - fp32 GEMM products 5e-5: both sides sum K <= 1024 fp32 products in different orders; the
//    typical difference is ~sqrt(K) ulp of the output's scale (~1e-6). 5e-5 leaves room for
//    split-K orders and stays far below the O(1) of a wrong index or transpose.
//  - bf16 GEMM products 1e-2: inputs rounded to bf16 (relative 2^-9 each), fp32 accumulation.
//    A CPU model of exactly that (bf16-rounded inputs, exact sums; forward, dinp and dweight
//    products of these shapes, 5 seeds) measured max_rel 2.3e-3..2.9e-3, and 5.6e-3 on the
//    17-term sums of B1 I17 O5 (fewer terms average less), NMSE 4.4e-6..1.9e-5: 1.8x margin
//    at worst, still ~100x below a wrong result.
//  - dbias 1e-5 in both precisions: an fp32 sum over the B rows either way (never bf16).
//  - dpre (the ReLU's backward) exact: a select, no arithmetic.
//  - An empty batch (B = 0) exact: the parameter gradients are zeroed, or kept when
//    accumulating, with no arithmetic.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

struct LinearShape {
  int B, I, O;
};
// {1024, 33, 10}: a bias gradient long enough to be summed in chunks (two passes).
const LinearShape kShapes[] = {
    {64, 300, 70}, {128, 784, 256}, {1, 17, 5}, {300, 64, 10}, {1024, 33, 10}};
const Tol kBiasTol = Tol::close(1e-5);
Tol gemm_tol(Precision p) { return Tol::close(p == Precision::bf16 ? 1e-2 : 5e-5); }

// A precision, a GEMM route and an alignment of the buffers on the backend under test.
struct Variant {
  Precision p;
  bool lt, misaligned;
};
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (Precision p : precisions(true))
    for (bool lt : {true, false})
      for (bool mis : {false, true}) v.push_back({p, lt, mis});
  return v;
}

OpCase make_case(const std::string& op, const LinearShape& s, const Variant& v) {
  OpCase c(fmt::format("{} B{} I{} O{} {}{}", op, s.B, s.I, s.O, v.lt ? "lt" : "gemmex",
                       v.misaligned ? " off1" : ""),
           v.p);
  c.cublaslt(v.lt).misaligned(v.misaligned);
  return c;
}

// The inputs of a shape: x (B,I), weight (O,I), bias (O), dout (B,O), prior gradients.
struct LinearData {
  std::vector<float> x, w, bias, dy, dw_prior, db_prior;
  explicit LinearData(const LinearShape& s)
      : x(random_vector(1, size_t(s.B) * s.I)),
        w(random_vector(2, size_t(s.O) * s.I)),
        bias(random_vector(3, size_t(s.O))),
        dy(random_vector(4, size_t(s.B) * s.O)),
        dw_prior(random_vector(5, size_t(s.O) * s.I)),
        db_prior(random_vector(6, size_t(s.O))) {}
};

void check_forward(bool relu) {
  const char* op = relu ? "linear_relu_forward" : "linear_forward";
  for (const LinearShape& s : kShapes) {
    const LinearData d(s);
    for (const Variant& v : variants())
      for (bool with_bias : {true, false}) {
        OpCase c = make_case(with_bias ? op : std::string(op) + " nobias", s, v);
        const F32 x = c.in(d.x), w = c.in(d.w), b = with_bias ? c.in(d.bias) : F32{};
        const F32 out = c.out("out", size_t(s.B) * s.O, gemm_tol(v.p));
        c.run([&](const Backend& be, const Ptrs& p) {
          (relu ? be.linear_relu_forward : be.linear_forward)(p[out], p[x], p[w], p[b], s.B, s.I,
                                                              s.O);
        });
      }
  }
}

// An empty batch: the parameter gradients are zeroed, or kept when accumulating.
void check_empty_batch(bool relu) {
  const LinearShape s{0, 7, 5};
  const LinearData d(s);
  for (Precision prec : precisions(true))
    for (bool accumulate : {true, false}) {
      OpCase c(fmt::format("{} B0 I7 O5{}", relu ? "linear_relu_backward" : "linear_backward",
                           accumulate ? " accumulate" : ""),
               prec);
      const F32 dy = c.in(d.dy), x = c.in(d.x), w = c.in(d.w);
      const F32 dw = c.inout("dweight", d.dw_prior, Tol::exact());
      const F32 db = c.inout("dbias", d.db_prior, Tol::exact());
      const F32 out = relu ? c.in(d.dy) : F32{},
                dpre = relu ? c.out("dpre", 0, Tol::exact()) : F32{};
      c.run([&](const Backend& be, const Ptrs& p) {
        if (relu)
          be.linear_relu_backward(nullptr, p[dw], p[db], p[dy], p[out], p[x], p[w], 0, s.I, s.O,
                                  p[dpre], accumulate);
        else
          be.linear_backward(nullptr, p[dw], p[db], p[dy], p[x], p[w], 0, s.I, s.O, accumulate);
      });
    }
}

}  // namespace

void check_linear_forward() { check_forward(false); }
void check_linear_relu_forward() { check_forward(true); }

// Overwriting all three gradients, then accumulating the parameter gradients without dinp.
void check_linear_backward() {
  for (const LinearShape& s : kShapes) {
    const LinearData d(s);
    for (const Variant& v : variants())
      for (bool accumulate : {false, true}) {
        OpCase c =
            make_case(accumulate ? "linear_backward accumulate, no dinp" : "linear_backward", s, v);
        const F32 dy = c.in(d.dy), x = c.in(d.x), w = c.in(d.w);
        const F32 dx = accumulate ? F32{} : c.out("dinp", size_t(s.B) * s.I, gemm_tol(v.p));
        const F32 dw = c.inout("dweight", d.dw_prior, gemm_tol(v.p));
        const F32 db = c.inout("dbias", d.db_prior, kBiasTol);
        c.run([&](const Backend& be, const Ptrs& p) {
          be.linear_backward(p[dx], p[dw], p[db], p[dy], p[x], p[w], s.B, s.I, s.O, accumulate);
        });
      }
  }
  check_empty_batch(false);
}

// From the reference's forward output, so both sides mask the same elements. Overwriting and
// accumulating; then only the ReLU's and the weight's gradients (no dinp, no dbias).
void check_linear_relu_backward() {
  for (const LinearShape& s : kShapes) {
    const LinearData d(s);
    std::vector<float> y(size_t(s.B) * s.O);
    reference().linear_relu_forward(y.data(), d.x.data(), d.w.data(), d.bias.data(), s.B, s.I, s.O);
    for (const Variant& v : variants())
      for (int mode : {0, 1, 2}) {
        const bool accumulate = mode == 1, all = mode < 2;
        OpCase c = make_case(mode == 0   ? "linear_relu_backward"
                             : mode == 1 ? "linear_relu_backward accumulate"
                                         : "linear_relu_backward no dinp, no dbias",
                             s, v);
        const F32 dy = c.in(d.dy), out = c.in(y), x = c.in(d.x), w = c.in(d.w);
        const F32 dx = all ? c.out("dinp", size_t(s.B) * s.I, gemm_tol(v.p)) : F32{};
        const F32 dw = c.inout("dweight", d.dw_prior, gemm_tol(v.p));
        const F32 db = all ? c.inout("dbias", d.db_prior, kBiasTol) : F32{};
        const F32 dpre = c.out("dpre", size_t(s.B) * s.O, Tol::exact());
        c.run([&](const Backend& be, const Ptrs& p) {
          be.linear_relu_backward(p[dx], p[dw], p[db], p[dy], p[out], p[x], p[w], s.B, s.I, s.O,
                                  p[dpre], accumulate);
        });
      }
  }
  check_empty_batch(true);
}

// ---- Finite differences of the reference ---------------------------------------------------

namespace {

constexpr int kFdB = 3, kFdI = 5, kFdO = 4;

// x (3,5), weight (4,5), bias (4) and the projection r (3,4); for linear_relu from the first
// seed whose pre-activations are 0.05 clear of the ReLU's kink (a step of 1e-2 in one input
// moves them by at most 1e-2).
struct FdInputs {
  std::vector<float> x, w, bias, r;
};
FdInputs fd_inputs(bool relu, bool with_bias) {
  const Backend& cpu = reference();
  std::vector<float> pre(size_t(kFdB) * kFdO);
  for (uint64_t seed = 2;; ++seed) {
    FdInputs d{random_vector(seed * 10 + 1, size_t(kFdB) * kFdI),
               random_vector(seed * 10 + 2, size_t(kFdO) * kFdI),
               random_vector(seed * 10 + 3, size_t(kFdO)),
               random_vector(seed * 10 + 4, size_t(kFdB) * kFdO)};
    cpu.linear_forward(pre.data(), d.x.data(), d.w.data(), with_bias ? d.bias.data() : nullptr,
                       kFdB, kFdI, kFdO);
    if (!relu || std::none_of(pre.begin(), pre.end(), [](float v) { return std::abs(v) < 0.05f; }))
      return d;
  }
}

// The gradients of L = sum(forward(x, w, bias) * r), with and without bias; `relu`
// differentiates linear_relu instead of linear.
void fd_linear(bool relu) {
  const Backend& cpu = reference();
  const auto forward = relu ? cpu.linear_relu_forward : cpu.linear_forward;
  const int B = kFdB, I = kFdI, O = kFdO;
  for (bool with_bias : {true, false}) {
    FdInputs d = fd_inputs(relu, with_bias);
    const float* bias = with_bias ? d.bias.data() : nullptr;
    auto loss = [&] {
      std::vector<float> y(size_t(B) * O);
      forward(y.data(), d.x.data(), d.w.data(), bias, B, I, O);
      return dot(y, d.r);
    };
    auto dx = nan_vector(size_t(B) * I), dw = nan_vector(size_t(O) * I), db = nan_vector(size_t(O));
    std::vector<float> y(size_t(B) * O), dpre(y.size());
    forward(y.data(), d.x.data(), d.w.data(), bias, B, I, O);
    if (relu)
      cpu.linear_relu_backward(dx.data(), dw.data(), db.data(), d.r.data(), y.data(), d.x.data(),
                               d.w.data(), B, I, O, dpre.data(), false);
    else
      cpu.linear_backward(dx.data(), dw.data(), db.data(), d.r.data(), d.x.data(), d.w.data(), B, I,
                          O, false);
    const std::string tag =
        fmt::format("fd {} B3 I5 O4{}: ", relu ? "linear_relu_backward" : "linear_backward",
                    with_bias ? "" : " nobias");
    Rng rng(7);
    check_grad(tag + "dinp", d.x, dx, loss, rng);
    check_grad(tag + "dweight", d.w, dw, loss, rng);
    if (with_bias) check_grad(tag + "dbias", d.bias, db, loss, rng);
  }
}

}  // namespace

void fd_linear_backward() { fd_linear(false); }
void fd_linear_relu_backward() { fd_linear(true); }

}  // namespace strata::optest
