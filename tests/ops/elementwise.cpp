// Elementwise ops: add_inplace, relu, gelu (erf and tanh), silu, residual_forward (and the CPU's add_bias_rows).
//
// Tolerances: exact wherever both sides do the same single IEEE operation per element (relu,
// add, residual). gelu 5e-6: CUDA's erff/expf are within 2 ulp of the true value, glibc's
// within 1 and the CPU's vectorised erfc within ~2e-7 * max(1, |x|) of them, plus nvcc's FMA
// contraction of cdf + x*pdf: a few ulp of the largest value (|x| <= 5), ~1e-6 at most.
// The CPU kernels' own tests ([cpu_kernel], cpu_kernel.h) and the finite-difference checks
// share their inputs (cpu_relu_inputs, cpu_gelu_inputs).
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

// Empty, one element, and odd and large (many blocks of a GPU kernel and a vector tail).
const int64_t kSizes[] = {0, 1, 100003};
const Tol kGeluTol = Tol::close(5e-6);

// The CPU kernels' inputs: forward against a double reference (or max), backward by finite
// differences. relu's kept 0.05 away from the kink at 0.
constexpr int kCpuReluN = 50, kCpuGeluN = 60;
std::vector<float> cpu_relu_inputs() {
  auto x = random_vector(4, kCpuReluN);
  for (auto& v : x) v += v < 0 ? -0.05f : 0.05f;
  return x;
}
std::vector<float> cpu_gelu_inputs() { return random_vector(5, kCpuGeluN, -4.f, 4.f); }

// Uniform in [-5, 5] with 0 and -0 first; NaN third when `nan` (relu keeps a NaN: x < 0 is
// false).
std::vector<float> activation_inputs(uint64_t seed, int64_t n, bool nan) {
  auto x = random_vector(seed, size_t(n), -5.f, 5.f);
  const float firsts[] = {0.f, -0.f, nan ? NAN : 0.5f};
  for (int k = 0; k < 3 && k < n; ++k) x[size_t(k)] = firsts[k];
  return x;
}

}  // namespace

void check_add_inplace() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("add_inplace n{}", n));
    const F32 dst = c.inout("dst", random_vector(61, size_t(n)), Tol::exact());
    const F32 src = c.in(random_vector(62, size_t(n)));
    c.run([&](const Backend& be, const Ptrs& p) { be.add_inplace(p[dst], p[src], n); });
  }
}

void check_relu_forward() {
  for (int64_t n : kSizes) {
    const auto x = activation_inputs(41, n, true);
    OpCase c(fmt::format("relu_forward n{}", n));
    const F32 inp = c.in(x), out = c.out("out", size_t(n), Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) { be.relu_forward(p[out], p[inp], n); });
    OpCase in_place(fmt::format("relu_forward in place n{}", n));
    const F32 io = in_place.inout("out", x, Tol::exact());
    in_place.run([&](const Backend& be, const Ptrs& p) { be.relu_forward(p[io], p[io], n); });
  }
}

void check_relu_backward() {
  for (int64_t n : kSizes) {
    const auto x = activation_inputs(41, n, true);
    std::vector<float> y(static_cast<size_t>(n));
    reference().relu_forward(y.data(), x.data(), n);
    OpCase c(fmt::format("relu_backward n{}", n));
    const F32 dout = c.in(random_vector(42, size_t(n))), out = c.in(y);
    const F32 dinp = c.out("dinp", size_t(n), Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) { be.relu_backward(p[dinp], p[dout], p[out], n); });
  }
}

void check_gelu_forward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("gelu_forward n{}", n));
    const F32 inp = c.in(activation_inputs(41, n, false)), out = c.out("out", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.gelu_forward(p[out], p[inp], n); });
  }
}

void check_gelu_backward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("gelu_backward n{}", n));
    const F32 dout = c.in(random_vector(42, size_t(n))),
              inp = c.in(activation_inputs(41, n, false));
    const F32 dinp = c.out("dinp", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.gelu_backward(p[dinp], p[dout], p[inp], n); });
  }
}

// The tanh GELU: the CPU's tanh from its vector exp against CUDA's tanhf, a few ulp either.
void check_gelu_tanh_forward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("gelu_tanh_forward n{}", n));
    const F32 inp = c.in(activation_inputs(41, n, false)), out = c.out("out", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.gelu_tanh_forward(p[out], p[inp], n); });
  }
}

void check_gelu_tanh_backward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("gelu_tanh_backward n{}", n));
    const F32 dout = c.in(random_vector(42, size_t(n))),
              inp = c.in(activation_inputs(41, n, false));
    const F32 dinp = c.out("dinp", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.gelu_tanh_backward(p[dinp], p[dout], p[inp], n); });
  }
}

// GELU with its derivative kept (CPU only: "cpu:gelu_forward_grad", ...), against the
// reference; the derivative written in place over the input, as the transformer block does.
// (Bitwise against gelu_forward and gelu_backward: "gelu forward with its derivative kept";
// the backward through it is linear_gelu_backward's, tests/ops/linear.cpp.)
namespace {
void check_forward_grad(bool tanh) {
  const char* op = tanh ? "gelu_tanh_forward_grad" : "gelu_forward_grad";
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("{} n{}", op, n));
    const F32 out = c.out("out", size_t(n), kGeluTol);
    const F32 grad = c.inout("inp, then grad", activation_inputs(41, n, false), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) {
      (tanh ? be.gelu_tanh_forward_grad : be.gelu_forward_grad)(p[out], p[grad], p[grad], n);
    });
  }
}
}  // namespace

void check_gelu_forward_grad() { check_forward_grad(false); }
void check_gelu_tanh_forward_grad() { check_forward_grad(true); }

// SiLU: the CPU's std::exp against CUDA's expf (2 ulp), through a division: a few ulp.
void check_silu_forward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("silu_forward n{}", n));
    const F32 inp = c.in(activation_inputs(41, n, false)), out = c.out("out", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.silu_forward(p[out], p[inp], n); });
  }
}

void check_silu_backward() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("silu_backward n{}", n));
    const F32 dout = c.in(random_vector(42, size_t(n))),
              inp = c.in(activation_inputs(41, n, false));
    const F32 dinp = c.out("dinp", size_t(n), kGeluTol);
    c.run([&](const Backend& be, const Ptrs& p) { be.silu_backward(p[dinp], p[dout], p[inp], n); });
  }
}

void check_residual_forward() {
  // 645 and 49344: the (N, C) of GPT-like shapes (129 x 5, 64 x 771).
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(645), int64_t(49344)}) {
    const auto a = random_vector(31, size_t(n), -2.f, 2.f), b = random_vector(34, size_t(n));
    OpCase c(fmt::format("residual_forward n{}", n));
    const F32 x = c.in(a), y = c.in(b), out = c.out("out", size_t(n), Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) { be.residual_forward(p[out], p[x], p[y], n); });
    OpCase in_place(fmt::format("residual_forward in place (out = a) n{}", n));
    const F32 io = in_place.inout("out", a, Tol::exact()), y2 = in_place.in(b);
    in_place.run(
        [&](const Backend& be, const Ptrs& p) { be.residual_forward(p[io], p[io], p[y2], n); });
  }
}

// ---- Finite differences of the reference ---------------------------------------------------

void fd_relu_backward() {
  const int n = kCpuReluN;
  auto x = cpu_relu_inputs();
  const auto r = random_vector(5, n);
  const Backend& cpu = reference();
  std::vector<float> out(n), dx = nan_vector(n);
  cpu.relu_forward(out.data(), x.data(), n);
  cpu.relu_backward(dx.data(), r.data(), out.data(), n);
  auto loss = [&] {
    std::vector<float> y(n);
    cpu.relu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  Rng rng(6);
  check_grad("fd relu_backward n50: dinp", x, dx, loss, rng);
}

void fd_gelu_backward() {
  const int n = kCpuGeluN;
  auto x = cpu_gelu_inputs();
  const auto r = random_vector(6, n);
  const Backend& cpu = reference();
  std::vector<float> dx = nan_vector(n);
  cpu.gelu_backward(dx.data(), r.data(), x.data(), n);
  auto loss = [&] {
    std::vector<float> y(n);
    cpu.gelu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  Rng rng(7);
  check_grad("fd gelu_backward n60: dinp", x, dx, loss, rng);
}

void fd_gelu_tanh_backward() {
  const int n = kCpuGeluN;
  auto x = cpu_gelu_inputs();
  const auto r = random_vector(6, n);
  const Backend& cpu = reference();
  std::vector<float> dx = nan_vector(n);
  cpu.gelu_tanh_backward(dx.data(), r.data(), x.data(), n);
  auto loss = [&] {
    std::vector<float> y(n);
    cpu.gelu_tanh_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  Rng rng(7);
  check_grad("fd gelu_tanh_backward n60: dinp", x, dx, loss, rng);
}

void fd_silu_backward() {
  const int n = 60;
  auto x = random_vector(8, n, -6.f, 6.f);
  const auto r = random_vector(9, n);
  const Backend& cpu = reference();
  std::vector<float> dx = nan_vector(n);
  cpu.silu_backward(dx.data(), r.data(), x.data(), n);
  auto loss = [&] {
    std::vector<float> y(n);
    cpu.silu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  Rng rng(10);
  check_grad("fd silu_backward n60: dinp", x, dx, loss, rng);
}

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

using namespace strata::cpu;

// (Backward, on these inputs: "relu_backward vs finite differences".)
TEST_CASE("relu forward", "[cpu_kernel][activation]") {
  const int n = kCpuReluN;
  const Vec x = cpu_relu_inputs();
  Vec out = nan_vec(n);
  relu_forward(out.data(), x.data(), n);
  for (int i = 0; i < n; ++i) CHECK(out[i] == std::max(x[i], 0.f));
}

// (Backward, on these inputs: "gelu_backward vs finite differences".)
TEST_CASE("gelu forward", "[cpu_kernel][activation]") {
  const int n = kCpuGeluN;
  const Vec x = cpu_gelu_inputs();
  Vec out = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = x[i] * 0.5 * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  check_close("gelu out", out, want, 4e-6);  // a few ulp of |out| <= 4 (erff is ~1 ulp)
}

// The forward that keeps the derivative, and the backward that multiplies by it: bitwise
// gelu_forward's and gelu_backward's, in place or not, on every length through the vector
// tails (both GELUs, over [-12, 12] with 0, -0 and NaN among them).
TEST_CASE("gelu forward with its derivative kept: bitwise gelu_forward and gelu_backward",
          "[cpu_kernel][activation]") {
  for (bool tanh : {false, true})
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(64), int64_t(100003)}) {
      INFO((tanh ? "tanh" : "erf") << ", n " << n);
      Vec x = random_vector(7, size_t(n), -12.f, 12.f);
      if (n > 3) x[0] = 0.f, x[1] = -0.f, x[2] = NAN;
      const Vec dy = random_vector(8, size_t(n));
      Vec out = nan_vec(n), want = nan_vec(n), grad = nan_vec(n), dx = nan_vec(n),
          dx_want = nan_vec(n);
      (tanh ? gelu_tanh_forward : gelu_forward)(want.data(), x.data(), n);
      (tanh ? gelu_tanh_backward : gelu_backward)(dx_want.data(), dy.data(), x.data(), n);
      (tanh ? gelu_tanh_forward_grad : gelu_forward_grad)(out.data(), grad.data(), x.data(), n);
      gelu_backward_kept(dx.data(), dy.data(), grad.data(), n);
      CHECK(std::memcmp(out.data(), want.data(), sizeof(float) * size_t(n)) == 0);
      CHECK(std::memcmp(dx.data(), dx_want.data(), sizeof(float) * size_t(n)) == 0);
      Vec in_place = x;  // grad over the input
      (tanh ? gelu_tanh_forward_grad : gelu_forward_grad)(out.data(), in_place.data(),
                                                           in_place.data(), n);
      CHECK(std::memcmp(in_place.data(), grad.data(), sizeof(float) * size_t(n)) == 0);
    }
}

TEST_CASE("add_bias_rows", "[cpu_kernel][activation]") {
  Vec x = {1, 2, 3, 4, 5, 6};
  const Vec b = {10, 20, 30};
  add_bias_rows(x.data(), b.data(), 2, 3);
  CHECK(x == Vec{11, 22, 33, 14, 25, 36});
}

TEST_CASE("residual_forward adds, also in place", "[cpu_kernel][residual]") {
  Rng rng(41);
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(1) << 16}) {
    const Vec a = rand_vec(rng, n), b = rand_vec(rng, n);
    Vec out = nan_vec(n);
    residual_forward(out.data(), a.data(), b.data(), n);
    bool exact = true;
    for (int64_t i = 0; i < n; ++i) exact = exact && out[i] == a[i] + b[i];
    CHECK(exact);
    Vec x = a;  // out aliases a
    residual_forward(x.data(), x.data(), b.data(), n);
    CHECK(bitwise_equal(x, out));
  }
}

// ---- GELU: the vectorised kernels against the scalar std::erf form -------------------------
// ("gelu forward" checks gelu against a double reference on [-4, 4], fd_gelu_backward by
// finite differences; these cover the whole range, the tails and every tail length of the
// lane loop.)

namespace {

// Inputs: a grid over [-12, 12] (where Phi goes from 1.8e-33 to 1 - 1.8e-33) in steps of 1e-3,
// random values in [-6, 6], and a few of large magnitude; n is odd, so the last, partial vector
// of the lane loop is covered too.
Vec gelu_inputs(Rng& rng) {
  Vec x;
  for (int i = -12000; i <= 12000; ++i) x.push_back(float(i) * 1e-3f);
  for (int i = 0; i < 5001; ++i) x.push_back(rng.uniform(-6.f, 6.f));
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 20.f, -20.f, 1e4f, -1e4f, 3e38f, -3e38f})
    x.push_back(v);
  return x;
}

// Phi(x) and phi(x) in double (std::erfc keeps the tail's relative precision).
double cdf_d(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double pdf_d(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

}  // namespace

// Tolerances. The reference itself is x * (1 + erff(z)) / 2 in fp32: 1 + erf rounds to 6e-8
// absolute, erff is within ~1 ulp, so its Phi is off the true one by up to ~1.2e-7 absolute;
// the vectorised Phi is within ~1.5e-7 (erfc's fit 1.2e-7 relative, the exp 2 ulp, the
// rounding of 1 - erfc/2). gelu = x * Phi then differs by up to ~3e-7 |x|, plus the rounding
// of the product. Measured here: 1.2e-7 max(1, |x|) at most (forward), 2.2e-7 (backward); the bound
// is 4e-7 max(1, |x|), while an erf that is wrong in its fit, sign or tail is off by 1e-3 to 1.
TEST_CASE("gelu: vectorised kernels match the scalar std::erf form over the whole range",
          "[cpu_kernel][activation]") {
  Rng rng(71);
  const Vec x = gelu_inputs(rng);
  const int64_t n = int64_t(x.size());
  REQUIRE(n % 16 != 0);
  const Vec dy = rand_vec(rng, n, -2.f, 2.f);
  Vec out = nan_vec(n), ref = nan_vec(n), dx = nan_vec(n), dref = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_forward_reference(ref.data(), x.data(), n);
  gelu_backward(dx.data(), dy.data(), x.data(), n);
  gelu_backward_reference(dref.data(), dy.data(), x.data(), n);
  double worst_f = 0, worst_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[size_t(i)], scale = std::max(1.0, std::abs(xi));
    const double ef = std::abs(double(out[size_t(i)]) - ref[size_t(i)]) / scale;
    const double eb = std::abs(double(dx[size_t(i)]) - dref[size_t(i)]) /
                      (scale * std::max(1.0, std::abs(double(dy[size_t(i)]))));
    worst_f = std::max(worst_f, ef);
    worst_b = std::max(worst_b, eb);
    INFO("x = " << xi << ": gelu " << out[size_t(i)] << " vs " << ref[size_t(i)] << ", dinp "
                << dx[size_t(i)] << " vs " << dref[size_t(i)]);
    CHECK(ef <= 4e-7);
    CHECK(eb <= 4e-7);
  }
  std::printf("gelu vs std::erf form: forward %.2e, backward %.2e (/ max(1,|x|))\n", worst_f,
              worst_b);
}

// Where x < 0, Phi = erfc(|z|)/2 is computed without cancellation: the result keeps its relative
// precision down to Phi ~ 1e-30 (x = -11.3), where the reference form (1 + erf) / 2 has none
// left (it is exactly 0 from x ~ -5.9). Bound: erfc's fit (1.2e-7) plus the exp's 2 ulp, the
// rounding of x*x (6e-8 of x^2/2 <= 64: up to 4e-6 relative at x = -11.3, the largest term)
// and of the product: 1e-5 relative; measured 3.9e-6 (forward), 1.9e-6 (backward).
TEST_CASE("gelu keeps its relative precision in the negative tail", "[cpu_kernel][activation]") {
  Vec x;
  for (float v = -0.5f; v >= -11.3f; v -= 0.01f) x.push_back(v);
  const int64_t n = int64_t(x.size());
  const Vec ones(size_t(n), 1.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), ones.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[size_t(i)];
    const double want = xi * cdf_d(xi), dwant = cdf_d(xi) + xi * pdf_d(xi);
    INFO("x = " << xi << ": gelu " << out[size_t(i)] << " want " << want);
    CHECK(std::abs(out[size_t(i)] - want) <= 1e-5 * std::abs(want));
    // gelu' = Phi + x phi cancels (Phi ~ -x phi (1 - 1/x^2)): relative 1e-5 of the terms.
    CHECK(std::abs(dx[size_t(i)] - dwant) <= 1e-5 * (cdf_d(xi) + std::abs(xi) * pdf_d(xi)));
  }
}

TEST_CASE("gelu: special values and every tail length", "[cpu_kernel][activation]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Vec x = {kNaN, inf, -inf, 0.f, -0.f, 1.f, -1.f};
  const int64_t n = int64_t(x.size());
  const Vec ones(size_t(n), 1.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), ones.data(), x.data(), n);
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(dx[0]));
  CHECK(out[1] == inf);     // inf * Phi(inf) = inf * 1
  CHECK(std::isnan(out[2]));  // -inf * 0, as x * (1 + erf(-inf)) / 2
  CHECK(out[3] == 0.f);
  CHECK(dx[3] == 0.5f);     // Phi(0)
  CHECK(std::abs(out[5] - 0.8413447461f) <= 1e-7f);
  CHECK(std::abs(out[6] + 0.1586552539f) <= 1e-7f);
  // Lengths 1..100 at every offset 0..3: each element as when computed in one long array
  // (the kernels are elementwise: neither a vector's other lanes, nor whether it falls in a
  // group of 4 vectors, a single vector or the tail may matter).
  Rng rng(72);
  const Vec big = rand_vec(rng, 160, -5.f, 5.f), dbig = rand_vec(rng, 160);
  Vec all(160), dall(160);
  gelu_forward(all.data(), big.data(), 160);
  gelu_backward(dall.data(), dbig.data(), big.data(), 160);
  for (int off = 0; off < 4; ++off)
    for (int len = 1; len <= 100; ++len) {
      Vec o = nan_vec(len + 1), d = nan_vec(len + 1);
      gelu_forward(o.data(), big.data() + off, len);
      gelu_backward(d.data(), dbig.data() + off, big.data() + off, len);
      INFO("offset " << off << ", length " << len);
      CHECK(bitwise_equal(Vec(o.begin(), o.begin() + len),
                          Vec(all.begin() + off, all.begin() + off + len)));
      CHECK(bitwise_equal(Vec(d.begin(), d.begin() + len),
                          Vec(dall.begin() + off, dall.begin() + off + len)));
      CHECK(std::isnan(o[size_t(len)]));  // nothing written past the end
      CHECK(std::isnan(d[size_t(len)]));
    }
}

TEST_CASE("gelu is bitwise the same with 1 and 2 threads", "[cpu_kernel][activation]") {
  Rng rng(73);
  const int64_t n = (int64_t(1) << 17) + 5;  // above the kernels' parallel threshold
  const Vec x = rand_vec(rng, n, -6.f, 6.f), dy = rand_vec(rng, n);
  Vec out[2], dx[2];
  for (int t : {1, 2}) {
    Threads threads(t);
    out[t - 1] = nan_vec(n);
    dx[t - 1] = nan_vec(n);
    gelu_forward(out[t - 1].data(), x.data(), n);
    gelu_backward(dx[t - 1].data(), dy.data(), x.data(), n);
  }
  CHECK(bitwise_equal(out[0], out[1]));
  CHECK(bitwise_equal(dx[0], dx[1]));
}

// ---- The tanh GELU against a double reference ----------------------------------------------
// GPT-2's form, 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), and its derivative, in
// double, over the erf tests' inputs (a grid over [-12, 12], random values, large ones). The
// kernel's tanh is (1 - e) / (1 + e) with its 2-ulp exp: ~2e-7 absolute in tanh, so ~1e-7 |x|
// in gelu, plus the float rounding of u (relative 2e-7 of u, up to ~2e-7 |x| in gelu where
// tanh' is large). Bound 5e-7 max(1, |x|) (backward: also * max(1, |dy|)); a wrong constant,
// sign or derivative term is off by 1e-4 or more (the erf form itself differs by up to 4.7e-4).
namespace {
double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_d(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
}  // namespace

TEST_CASE("gelu tanh: kernels match a double reference over the whole range",
          "[cpu_kernel][activation]") {
  Rng rng(73);
  Vec x = gelu_inputs(rng);
  x.resize(x.size() - 2);  // not +-3e38: x^3 overflows to inf there (gelu is still x or -0)
  const int64_t n = int64_t(x.size());
  REQUIRE(n % 16 != 0);
  const Vec dy = rand_vec(rng, n, -2.f, 2.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_tanh_forward(out.data(), x.data(), n);
  gelu_tanh_backward(dx.data(), dy.data(), x.data(), n);
  double worst_f = 0, worst_b = 0, worst_vs_erf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[size_t(i)], scale = std::max(1.0, std::abs(xi));
    const double ef = std::abs(out[size_t(i)] - gelu_tanh_d(xi)) / scale;
    const double eb = std::abs(dx[size_t(i)] - dy[size_t(i)] * gelu_tanh_grad_d(xi)) /
                      (scale * std::max(1.0, std::abs(double(dy[size_t(i)]))));
    worst_f = std::max(worst_f, ef);
    worst_b = std::max(worst_b, eb);
    if (std::abs(xi) < 20) worst_vs_erf = std::max(worst_vs_erf, std::abs(gelu_tanh_d(xi) - xi * cdf_d(xi)));
    INFO("x = " << xi << ": gelu_tanh " << out[size_t(i)] << " vs " << gelu_tanh_d(xi)
                << ", dinp " << dx[size_t(i)] << " vs " << dy[size_t(i)] * gelu_tanh_grad_d(xi));
    CHECK(ef <= 5e-7);
    CHECK(eb <= 5e-7);
  }
  std::printf("gelu tanh vs double: forward %.2e, backward %.2e (/ max(1,|x|)); tanh - erf form "
              "up to %.2e\n", worst_f, worst_b, worst_vs_erf);
  CHECK(worst_vs_erf > 4e-4);  // the two forms are told apart by these inputs
}

TEST_CASE("gelu tanh: special values and every tail length", "[cpu_kernel][activation]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Vec x = {kNaN, inf, -inf, 0.f, 1.f, -1.f, 3e38f};
  const int64_t n = int64_t(x.size());
  const Vec ones(size_t(n), 1.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_tanh_forward(out.data(), x.data(), n);
  gelu_tanh_backward(dx.data(), ones.data(), x.data(), n);
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(dx[0]));
  CHECK(out[1] == inf);
  CHECK(out[3] == 0.f);
  CHECK(dx[3] == 0.5f);
  CHECK(std::abs(out[4] - 0.8411919906f) <= 1e-7f);  // PyTorch's gelu(1, approximate='tanh')
  CHECK(std::abs(out[5] + 0.1588080094f) <= 1e-7f);
  CHECK(out[6] == 3e38f);
  Rng rng(74);  // as for the erf form: groups of 4 vectors, single vectors, tails
  const Vec big = rand_vec(rng, 160, -5.f, 5.f), dbig = rand_vec(rng, 160);
  Vec all(160), dall(160);
  gelu_tanh_forward(all.data(), big.data(), 160);
  gelu_tanh_backward(dall.data(), dbig.data(), big.data(), 160);
  for (int off = 0; off < 4; ++off)
    for (int len = 1; len <= 100; ++len) {
      Vec o = nan_vec(len), d = nan_vec(len);
      gelu_tanh_forward(o.data(), big.data() + off, len);
      gelu_tanh_backward(d.data(), dbig.data() + off, big.data() + off, len);
      INFO("offset " << off << ", length " << len);
      CHECK(bitwise_equal(o, Vec(all.begin() + off, all.begin() + off + len)));
      CHECK(bitwise_equal(d, Vec(dall.begin() + off, dall.begin() + off + len)));
    }
}

}  // namespace strata::optest
