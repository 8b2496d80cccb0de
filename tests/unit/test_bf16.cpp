// The CPU's bf16 path (kernels/cpu/bf16.cpp, gemm.cpp): rounding to nearest even, and GEMMs
// that compute exactly the products of the rounded inputs with fp32 accumulation.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "strata/backend.h"
#include "strata/kernels_cpu.h"
#include "strata/rng.h"

using namespace strata;

namespace {

bool have_bf16() {
  std::string why;
  if (cpu::bf16_supported(&why)) return true;
  WARN("bf16 not checked on this CPU: " << why);
  return false;
}

float widen(cpu::bf16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<cpu::bf16_t> b(x.size());
  cpu::to_bf16(b.data(), x.data(), int64_t(x.size()));
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = widen(b[i]);
  return out;
}

}  // namespace

TEST_CASE("bf16: rounding to nearest even, NaN kept, every length", "[bf16]") {
  if (!have_bf16()) return;
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to the even one, 1;
  // 1 + 3*2^-8 ties between 1 + 2^-7 (odd) and 1 + 2^-6: up. Just above a tie rounds up.
  const std::vector<float> x = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 1.f + 0x1p-8f + 0x1p-20f,
                                -2.5f, 0.f, std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), 3.0e38f};
  const std::vector<float> want = {1.f, 1.f + 0x1p-6f, 1.f + 0x1p-7f, -2.5f, 0.f,
                                   std::numeric_limits<float>::infinity(), 0.f, 0.f};
  auto got = rounded(x);
  for (size_t i = 0; i < 6; ++i) CHECK(got[i] == want[i]);
  CHECK(std::isnan(got[6]));
  CHECK(got[7] == Approx(3.0e38f).epsilon(1e-2));
  // Every length from 0 to 40 (the masked tail): each element as when converted alone.
  Rng rng(7);
  std::vector<float> v(40);
  for (auto& e : v) e = rng.uniform(-3.f, 3.f);
  for (size_t n = 0; n <= v.size(); ++n) {
    std::vector<float> part(v.begin(), v.begin() + long(n));
    auto r = rounded(part);
    for (size_t i = 0; i < n; ++i) {
      INFO("n " << n << " i " << i);
      CHECK(r[i] == rounded({v[i]})[0]);
      CHECK(std::abs(r[i] - v[i]) <= std::abs(v[i]) * 0x1p-8f);
    }
  }
}

TEST_CASE("bf16: the linear op multiplies the rounded inputs, accumulating in fp32", "[bf16]") {
  if (!have_bf16()) return;
  const int B = 33, I = 70, O = 21;
  Rng rng(3);
  std::vector<float> x(size_t(B) * I), w(size_t(O) * I), bias(O), out(size_t(B) * O),
      out32(size_t(B) * O);
  for (auto* v : {&x, &w, &bias})
    for (auto& e : *v) e = rng.uniform(-1.f, 1.f);
  cpu_backend(true).linear_forward(out.data(), x.data(), w.data(), bias.data(), B, I, O);
  cpu_backend(false).linear_forward(out32.data(), x.data(), w.data(), bias.data(), B, I, O);
  const auto xr = rounded(x), wr = rounded(w);
  double worst_exact = 0, worst_fp32 = 0;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < O; ++o) {
      double exact = bias[size_t(o)];  // the product of the rounded inputs, in double
      for (int i = 0; i < I; ++i) exact += double(xr[size_t(b) * I + i]) * wr[size_t(o) * I + i];
      const double got = out[size_t(b) * O + o];
      worst_exact = std::max(worst_exact, std::abs(got - exact));
      worst_fp32 = std::max(worst_fp32, std::abs(got - double(out32[size_t(b) * O + o])));
    }
  // fp32 accumulation of 70 products of size <= 1: a few ulps of the sum. Against the fp32
  // op the inputs' rounding (2^-9 relative each) shows: far more than that.
  CHECK(worst_exact < 1e-5);
  CHECK(worst_fp32 > 1e-3);
}
