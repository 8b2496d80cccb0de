// The CPU kernels' own tests (tag [cpu_kernel]; ctest "ops:<name>"), in each op's family file
// beside its op-table check and its finite-difference check, on the same shape list: the
// kernel against a naive double-precision reference, the tie and NaN rules, null and
// accumulated gradients, bitwise the same with 1 and 2 threads. These helpers are theirs.
//
// Tolerances against the double references are absolute, on values of magnitude ~1 (inputs
// uniform in [-1, 1] unless said otherwise): fp32 rounding of a sum of K such terms is
// ~sqrt(K) * 6e-8 typically, K * 6e-8 at worst. Each test says what its bound is and why,
// while a wrong index, a missed mask, a wrong scale or a transposed head is an error of 1e-2
// to 1.
#pragma once
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/rng.h"

namespace strata::optest {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline Vec rand_vec(Rng& rng, int64_t n, float lo = -1.f, float hi = 1.f) {
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// NaN-filled buffer: an output a kernel fails to overwrite shows up in the comparisons.
inline Vec nan_vec(int64_t n) { return Vec(size_t(n), kNaN); }

// max |got - want| over a tensor must be <= tol; reports the worst element (NaN counts as
// worst).
inline void check_close(const std::string& what, const Vec& got, const DVec& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got[i]) - want[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
      if (e != e) break;
    }
  }
  if (got.empty()) return;
  INFO(what << ": max error " << worst << " at [" << at << "]: got " << got[at] << ", want "
            << want[at] << " (tolerance " << tol << ")");
  CHECK(worst <= tol);
}

// max |got / want - 1| over a tensor must be <= tol (want nonzero).
inline void check_rel(const std::string& what, const Vec& got, const DVec& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got[i]) / want[i] - 1.0);
    if (!(e <= worst)) {
      worst = e;
      at = i;
      if (e != e) break;
    }
  }
  if (got.empty()) return;
  INFO(what << ": max relative error " << worst << " at [" << at << "]: got " << got[at]
            << ", want " << want[at] << " (tolerance " << tol << ")");
  CHECK(worst <= tol);
}

inline bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Sets the kernels' OpenMP thread count for a scope and restores it after.
struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { cpu::blas_init(n); }
  ~Threads() { cpu::blas_init(saved); }
};

}  // namespace strata::optest
