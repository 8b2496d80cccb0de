// Elementwise ops: add_inplace, relu, gelu, silu, residual_forward.
//
// Tolerances: exact wherever both sides do the same single IEEE operation per element (relu,
// add, residual). gelu 5e-6: CUDA's erff/expf are within 2 ulp of the true value, glibc's
// within 1 and the CPU's vectorised erfc within ~2e-7 * max(1, |x|) of them, plus nvcc's FMA
// contraction of cdf + x*pdf: a few ulp of the largest value (|x| <= 5), ~1e-6 at most.
#include <fmt/format.h>

#include <cmath>

#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

// Empty, one element, and odd and large (many blocks of a GPU kernel and a vector tail).
const int64_t kSizes[] = {0, 1, 100003};
const Tol kGeluTol = Tol::close(5e-6);

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
  const int n = 50;
  auto x = random_vector(4, n);
  for (auto& v : x) v += v < 0 ? -0.05f : 0.05f;  // away from the kink at 0
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
  const int n = 60;
  auto x = random_vector(5, n, -4.f, 4.f);
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

}  // namespace strata::optest
