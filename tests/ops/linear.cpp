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
// The CPU kernels' own tests ([cpu_kernel], cpu_kernel.h: sgemm against a naive triple loop,
// linear's null and accumulated gradients, the large-weight gradient) at the end; the linear
// one and the finite-difference checks share one shape (kCpuB, kCpuI, kCpuO).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "skip.h"
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

// CPU only ("cpu:linear_gelu_backward"): with the GELU's derivative given (any factor: the op
// multiplies by it), dpre written or not.
void check_linear_gelu_backward() {
  for (const LinearShape& s : kShapes) {
    const LinearData d(s);
    const auto grad = random_vector(7, size_t(s.B) * s.O, 0.f, 1.2f);
    for (Precision prec : precisions(true))
      for (int mode : {0, 1, 2}) {
        const bool accumulate = mode == 1, want_dpre = mode < 2;
        OpCase c(fmt::format("linear_gelu_backward B{} I{} O{}{}", s.B, s.I, s.O,
                             mode == 1 ? " accumulate" : mode == 2 ? " no dpre" : ""),
                 prec);
        const F32 dy = c.in(d.dy), g = c.in(grad), x = c.in(d.x), w = c.in(d.w);
        const F32 dx = c.out("dinp", size_t(s.B) * s.I, gemm_tol(prec));
        const F32 dw = c.inout("dweight", d.dw_prior, gemm_tol(prec));
        const F32 db = c.inout("dbias", d.db_prior, kBiasTol);
        const F32 dpre = want_dpre ? c.out("dpre", size_t(s.B) * s.O, Tol::exact()) : F32{};
        c.run([&](const Backend& be, const Ptrs& p) {
          be.linear_gelu_backward(p[dx], p[dw], p[db], p[dy], p[g], p[x], p[w], s.B, s.I, s.O,
                                  p[dpre], accumulate);
        });
      }
  }
}

// ---- Finite differences of the reference ---------------------------------------------------

namespace {

// The CPU kernel's shape: null and accumulated gradients, and finite differences.
constexpr int kCpuB = 3, kCpuI = 5, kCpuO = 4;

// x (3,5), weight (4,5), bias (4) and the projection r (3,4); for linear_relu from the first
// seed whose pre-activations are 0.05 clear of the ReLU's kink (a step of 1e-2 in one input
// moves them by at most 1e-2).
struct FdInputs {
  std::vector<float> x, w, bias, r;
};
FdInputs fd_inputs(bool relu, bool with_bias) {
  const Backend& cpu = reference();
  std::vector<float> pre(size_t(kCpuB) * kCpuO);
  for (uint64_t seed = 2;; ++seed) {
    FdInputs d{random_vector(seed * 10 + 1, size_t(kCpuB) * kCpuI),
               random_vector(seed * 10 + 2, size_t(kCpuO) * kCpuI),
               random_vector(seed * 10 + 3, size_t(kCpuO)),
               random_vector(seed * 10 + 4, size_t(kCpuB) * kCpuO)};
    cpu.linear_forward(pre.data(), d.x.data(), d.w.data(), with_bias ? d.bias.data() : nullptr,
                       kCpuB, kCpuI, kCpuO);
    if (!relu || std::none_of(pre.begin(), pre.end(), [](float v) { return std::abs(v) < 0.05f; }))
      return d;
  }
}

// The gradients of L = sum(forward(x, w, bias) * r), with and without bias; `relu`
// differentiates linear_relu instead of linear.
void fd_linear(bool relu) {
  const Backend& cpu = reference();
  const auto forward = relu ? cpu.linear_relu_forward : cpu.linear_forward;
  const int B = kCpuB, I = kCpuI, O = kCpuO;
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

// L = sum(gelu(linear(x, w, bias)) * r), the GELU's derivative from gelu_forward_grad.
void fd_linear_gelu_backward() {
  const Backend& cpu = reference();
  const int B = kCpuB, I = kCpuI, O = kCpuO;
  FdInputs d = fd_inputs(false, true);
  auto loss = [&] {
    std::vector<float> pre(size_t(B) * O), y(pre.size());
    cpu.linear_forward(pre.data(), d.x.data(), d.w.data(), d.bias.data(), B, I, O);
    cpu.gelu_forward(y.data(), pre.data(), int64_t(y.size()));
    return dot(y, d.r);
  };
  std::vector<float> pre(size_t(B) * O), y(pre.size());
  cpu.linear_forward(pre.data(), d.x.data(), d.w.data(), d.bias.data(), B, I, O);
  cpu.gelu_forward_grad(y.data(), pre.data(), pre.data(), int64_t(pre.size()));  // in place
  auto dx = nan_vector(size_t(B) * I), dw = nan_vector(size_t(O) * I), db = nan_vector(size_t(O));
  cpu.linear_gelu_backward(dx.data(), dw.data(), db.data(), d.r.data(), pre.data(), d.x.data(),
                           d.w.data(), B, I, O, nullptr, false);
  Rng rng(7);
  check_grad("fd linear_gelu_backward B3 I5 O4: dinp", d.x, dx, loss, rng);
  check_grad("fd linear_gelu_backward B3 I5 O4: dweight", d.w, dw, loss, rng);
  check_grad("fd linear_gelu_backward B3 I5 O4: dbias", d.bias, db, loss, rng);
}

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

using namespace strata::cpu;

namespace {

// C = alpha op(A) op(B) + beta C in double; also returns the magnitude sum for the tolerance.
void ref_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Vec& A, int lda,
              const Vec& B, int ldb, float beta, const Vec& C0, int ldc, std::vector<double>& C,
              std::vector<double>& mag) {
  C.assign(C0.size(), 0.0);
  mag.assign(C0.size(), 0.0);
  for (size_t i = 0; i < C0.size(); ++i) C[i] = C0[i];  // untouched entries outside (M,N)
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0, m = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[int64_t(k) * lda + i] : A[int64_t(i) * lda + k];
        const double b = tb ? B[int64_t(j) * ldb + k] : B[int64_t(k) * ldb + j];
        s += a * b;
        m += std::abs(a * b);
      }
      const double c = C0[int64_t(i) * ldc + j];
      C[int64_t(i) * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * c);
      mag[int64_t(i) * ldc + j] = std::abs(alpha) * m + (beta == 0 ? 0.0 : std::abs(beta * c));
    }
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

}  // namespace

// ---- BLAS ----------------------------------------------------------------------------------

TEST_CASE("blas uses the widest vector kernels this CPU has", "[cpu_kernel][blas]") {
  blas_init(1);
  blas_init(1);  // a second call is harmless
  const std::string name = blas_corename();
  INFO("GEMM kernels: " << name);
  CHECK(!name.empty());
  // The OpenBLAS trap (FACTS.md): on a VM reporting a generic CPU model, name-based dispatch
  // falls back to SSE kernels. oneDNN dispatches on cpuid flags; check it sees AVX-512.
  if (cpu_has_avx512()) CHECK(name.find("avx512") != std::string::npos);
}

TEST_CASE("sgemm matches a naive triple loop", "[cpu_kernel][blas]") {
  Rng rng(1);
  struct Size {
    int M, N, K;
  };
  for (Size sz : {Size{1, 1, 1}, Size{7, 5, 3}, Size{13, 17, 19}, Size{33, 2, 65},
                  Size{2, 40, 9}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 0.5f}) {
          const int M = sz.M, N = sz.N, K = sz.K;
          // Leading dimensions wider than the matrices, so ld is really used.
          const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
          const Vec A = rand_vec(rng, int64_t(ta ? K : M) * lda);
          const Vec B = rand_vec(rng, int64_t(tb ? N : K) * ldb);
          Vec C = rand_vec(rng, int64_t(M) * ldc);
          if (beta == 0)  // beta = 0 must overwrite, even NaN
            for (int i = 0; i < M; ++i)
              std::fill(C.begin() + int64_t(i) * ldc, C.begin() + int64_t(i) * ldc + N, kNaN);
          std::vector<double> want, mag;
          ref_gemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, beta, C, ldc, want, mag);
          sgemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (size_t i = 0; i < C.size(); ++i) {
            INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb
                      << " beta=" << beta << " C[" << i << "] = " << C[i] << ", want "
                      << want[i]);
            if (int64_t(i) % ldc >= N)  // padding column: untouched
              CHECK(C[i] == want[i]);
            else
              // K <= 65: the fp32 worst case 65 * 6e-8 * mag is 4e-6 * mag.
              CHECK(std::abs(C[i] - want[i]) <= 1e-5 * mag[i] + 1e-30);
          }
        }
}

TEST_CASE("sgemm on empty sizes", "[cpu_kernel][blas]") {
  Vec C = {kNaN, kNaN, 2.f, 4.f};
  // K == 0: C = beta * C; beta == 0 overwrites (NaN included). lda/ldb of 0 would be
  // rejected by BLAS, so this also checks BLAS is not called.
  sgemm(false, false, 1, 2, 0, 1.f, nullptr, 0, nullptr, 0, 0.f, C.data(), 2);
  CHECK(C[0] == 0.f);
  CHECK(C[1] == 0.f);
  sgemm(true, true, 1, 2, 0, 1.f, nullptr, 0, nullptr, 0, 0.5f, C.data() + 2, 2);
  CHECK(C[2] == 1.f);
  CHECK(C[3] == 2.f);
  // M == 0 or N == 0: nothing to do, nothing touched.
  sgemm(false, false, 0, 2, 3, 1.f, nullptr, 3, nullptr, 2, 0.f, C.data(), 2);
  sgemm(false, false, 2, 0, 3, 1.f, nullptr, 3, nullptr, 1, 0.f, C.data(), 1);
  CHECK(C[2] == 1.f);
}

// (The gradients' values, on this shape: "linear_backward vs finite differences".)
TEST_CASE("linear forward, and backward's null and accumulated gradients", "[cpu_kernel][linear]") {
  Rng rng(2);
  const int B = kCpuB, I = kCpuI, O = kCpuO;
  Vec x = rand_vec(rng, B * I), w = rand_vec(rng, O * I), bias = rand_vec(rng, O);
  const Vec r = rand_vec(rng, B * O);
  for (bool with_bias : {true, false}) {
    const float* bp = with_bias ? bias.data() : nullptr;
    Vec out = nan_vec(B * O);
    linear_forward(out.data(), x.data(), w.data(), bp, B, I, O);
    std::vector<double> want(B * O);
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < O; ++o) {
        double s = with_bias ? bias[o] : 0.0;
        for (int i = 0; i < I; ++i) s += double(x[b * I + i]) * w[o * I + i];
        want[b * O + o] = s;
      }
    check_close("linear out", out, want, 1e-5);  // 6 terms in [-1,1]: ~1e-6 worst case

    Vec dx = nan_vec(B * I), dw = nan_vec(O * I), db = nan_vec(O);
    linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), B, I, O, false);

    // Null gradients are skipped; the others do not change.
    Vec dw2 = nan_vec(O * I);
    linear_backward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), B, I, O, false);
    CHECK(dw2 == dw);

    // accumulate adds the parameter gradients to what is there (micro-batches of a step).
    Vec dw3(O * I, 1.f), db3(O, 1.f), dx3 = nan_vec(B * I);
    linear_backward(dx3.data(), dw3.data(), with_bias ? db3.data() : nullptr, r.data(), x.data(),
                    w.data(), B, I, O, true);
    for (int i = 0; i < O * I; ++i) CHECK(dw3[i] == Approx(dw[i] + 1.f).margin(1e-5));
    if (with_bias)
      for (int o = 0; o < O; ++o) CHECK(db3[o] == Approx(db[o] + 1.f).margin(1e-5));
    CHECK(dx3 == dx);
  }
}

// ---- Linear weight gradient through the matmul primitive ------------------------------------
// linear_backward sends the weight gradient of weights of at least 2^19 elements (the GPT's c_fc
// and mlp c_proj) through a oneDNN matmul primitive, with a sum post-op when accumulating; the
// other linear tests use small weights (sgemm). Here both GPT shapes, with B = 65 rows (at 64
// and fewer the small-row kernels take the product, below), against a double reference: each
// element is a dot product of 65 terms of magnitude <= 1 (std ~2.7), whose fp32 rounding is
// ~sqrt(65) * 6e-8 * 2.7 = 1.3e-6 typically, 65 * 6e-8 * 65 = 2.5e-4 at the very worst;
// tolerance 1e-4 (plus 1e-6 of the value accumulated onto), still 100x below a wrong index.
TEST_CASE("linear weight gradient of a large weight (matmul primitive), also accumulating",
          "[cpu_kernel][linear]") {
  Rng rng(74);
  for (auto [I, O] : {std::pair{384, 1536}, std::pair{1536, 384}}) {
    const int B = 65;
    const Vec x = rand_vec(rng, int64_t(B) * I), w = rand_vec(rng, int64_t(O) * I),
              dy = rand_vec(rng, int64_t(B) * O), prior = rand_vec(rng, int64_t(O) * I);
    DVec want(size_t(O) * I);
    for (int o = 0; o < O; ++o)
      for (int i = 0; i < I; ++i) {
        double acc = 0;
        for (int b = 0; b < B; ++b) acc += double(dy[size_t(b) * O + o]) * x[size_t(b) * I + i];
        want[size_t(o) * I + i] = acc;
      }
    for (bool accumulate : {false, true}) {
      INFO("I " << I << ", O " << O << ", accumulate " << accumulate);
      Vec dw = accumulate ? prior : nan_vec(int64_t(O) * I);
      linear_backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), B, I, O,
                      accumulate);
      double worst = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        const double expect = accumulate ? prior[j] + want[j] : want[j];
        worst = std::max(worst, std::abs(dw[j] - expect) - 1e-6 * std::abs(expect));
      }
      CHECK(worst <= 1e-4);
    }
  }
}

// ---- Small-row products (kernels/cpu/small_gemm.cpp) ---------------------------------------
// At up to 64 rows on AVX-512 all three products take strata's own register-tiled kernels,
// which add each element's products one FMA at a time from zero in k order (then the bias,
// then ReLU as max(x, 0); an accumulated weight gradient adds the sum to what was there).
// That order is the contract, so the results must equal a scalar loop of std::fma in that
// order bit for bit, whatever the tile edges: rows past a multiple of 6, columns past a
// multiple of 16 and of 64, K of 0 and 1, the MLP's layers.
float fma_dot(int K, const float* a, int64_t sa, const float* b, int64_t sb) {
  float c = 0.f;
  for (int k = 0; k < K; ++k) c = std::fma(a[k * sa], b[k * sb], c);
  return c;
}

TEST_CASE("linear at up to 64 rows: each sum in k order, bitwise", "[cpu_kernel][linear]") {
  if (!cpu_has_avx512()) STRATA_SKIP("no AVX-512F: the small-row kernels do not run here");
  const LinearShape shapes[] = {{64, 784, 256}, {64, 256, 128}, {64, 128, 10}, {37, 101, 53},
                                {1, 17, 5},     {7, 1, 80},     {64, 0, 16},   {6, 33, 65}};
  Rng rng(75);
  for (const LinearShape& s : shapes) {
    const int B = s.B, I = s.I, O = s.O;
    INFO("B " << B << ", I " << I << ", O " << O);
    const Vec x = rand_vec(rng, int64_t(B) * I), w = rand_vec(rng, int64_t(O) * I),
              bias = rand_vec(rng, O), dy = rand_vec(rng, int64_t(B) * O),
              prior = rand_vec(rng, int64_t(O) * I);
    for (bool relu : {false, true}) {
      Vec y = nan_vec(int64_t(B) * O), want(y.size());
      (relu ? linear_relu_forward : linear_forward)(y.data(), x.data(), w.data(), bias.data(), B,
                                                    I, O);
      for (int b = 0; b < B; ++b)
        for (int o = 0; o < O; ++o) {
          const float v = fma_dot(I, &x[size_t(b) * I], 1, &w[size_t(o) * I], 1) + bias[o];
          want[size_t(b) * O + o] = relu ? std::max(v, 0.f) : v;
        }
      CHECK(bitwise_equal(y, want));
    }
    for (bool accumulate : {false, true}) {
      Vec dx = nan_vec(int64_t(B) * I), dw = accumulate ? prior : nan_vec(int64_t(O) * I);
      linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), B, I, O,
                      accumulate);
      Vec want_dx(dx.size()), want_dw(dw.size());
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < I; ++i)
          want_dx[size_t(b) * I + i] = fma_dot(O, &dy[size_t(b) * O], 1, &w[i], I);
      for (int o = 0; o < O; ++o)
        for (int i = 0; i < I; ++i) {
          const float g = fma_dot(B, &dy[o], O, &x[i], I);
          want_dw[size_t(o) * I + i] = accumulate ? prior[size_t(o) * I + i] + g : g;
        }
      INFO("accumulate " << accumulate);
      CHECK(bitwise_equal(dx, want_dx));
      CHECK(bitwise_equal(dw, want_dw));
    }
  }
}

// The backward through a kept GELU derivative, in each precision the CPU runs: bitwise
// gelu_backward followed by linear_backward (bf16: its pass that forms dpre also rounds and
// sums it), dpre written or not, overwriting and accumulating; shapes past 64 rows and with
// column tails (the bf16 pass goes 16 columns at a time).
TEST_CASE("linear_gelu_backward: bitwise gelu_backward then linear_backward",
          "[cpu_kernel][linear]") {
  struct Shape { int B, I, O; };
  std::vector<Precision> precs = {Precision::fp32};
  if (bf16_supported(nullptr)) precs.push_back(Precision::bf16);
  for (Precision prec : precs)
    for (auto [B, I, O] : {Shape{3, 5, 7}, Shape{64, 40, 100}, Shape{300, 33, 70}}) {
      INFO(precision_name(prec) << " B" << B << " I" << I << " O" << O);
      const Backend& be = cpu_backend(prec);
      const Vec x = random_vector(1, size_t(B) * I), w = random_vector(2, size_t(O) * I),
                dy = random_vector(3, size_t(B) * O), pre = random_vector(4, size_t(B) * O, -4.f, 4.f);
      Vec grad(pre.size()), y(pre.size()), want_pre(pre.size());
      gelu_forward_grad(y.data(), grad.data(), pre.data(), int64_t(pre.size()));
      gelu_backward(want_pre.data(), dy.data(), pre.data(), int64_t(pre.size()));
      for (int mode : {0, 1, 2}) {
        const bool accumulate = mode == 1, want_dpre = mode != 2;
        INFO("mode " << mode);
        Vec dx = nan_vec(int64_t(B) * I), dw = random_vector(5, size_t(O) * I),
            db = random_vector(6, size_t(O)), dpre = nan_vec(int64_t(B) * O);
        Vec dx2 = dx, dw2 = dw, db2 = db;
        be.linear_gelu_backward(dx.data(), dw.data(), db.data(), dy.data(), grad.data(), x.data(),
                                w.data(), B, I, O, want_dpre ? dpre.data() : nullptr, accumulate);
        be.linear_backward(dx2.data(), dw2.data(), db2.data(), want_pre.data(), x.data(),
                           w.data(), B, I, O, accumulate);
        auto same = [](const Vec& a, const Vec& b) {
          return std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
        };
        CHECK(same(dx, dx2));
        CHECK(same(dw, dw2));
        CHECK(same(db, db2));
        if (want_dpre) CHECK(same(dpre, want_pre));
      }
    }
}

}  // namespace strata::optest
