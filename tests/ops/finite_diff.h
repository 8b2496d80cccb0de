// Finite-difference checks of the CPU reference's backward ops: an analytic gradient against
// central differences (L(x+e) - L(x-e)) / 2e of L = sum(out * r) for a random projection r,
// the forward run by the reference in fp32 and L summed in double.
//
// Tolerance: |analytic - fd| <= kFdTol + kFdTol |fd| with step kFdEps = 1e-2 and kFdTol = 1e-3. The
// rounding of L (fp32 outputs, ~1e-7 relative, times sqrt(#outputs) for the sum) divided by the
// step 2e = 2e-2 gives ~1e-4..1e-3 absolute error on gradients of magnitude ~1. The ops are
// linear or piecewise linear in each input (no truncation error; inputs are kept away from
// kinks) except GELU, softmax, layernorm and attention, whose truncation error e^2 f'''/6 is
// ~1e-5..1e-4. Observed errors are below 1e-4; the bound still fails the O(0.1..1) error of a
// wrong index, sign or factor.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "strata/rng.h"

namespace strata::optest {

inline constexpr float kFdEps = 1e-2f;
inline constexpr double kFdTol = 1e-3;

// The analytic gradients are written into NaN-filled buffers: an element the backward op
// leaves unwritten fails its check.
inline std::vector<float> nan_vector(size_t n) { return std::vector<float>(n, NAN); }

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += double(a[k]) * b[k];
  return s;
}

// Indices to check: all of them for small tensors, else a random 64.
inline std::vector<size_t> fd_indices(size_t n, Rng& rng) {
  std::vector<size_t> idx;
  if (n <= 64) {
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), size_t(0));
  } else {
    for (int k = 0; k < 64; ++k) idx.push_back(size_t(rng.below(n)));
  }
  return idx;
}

// grad against central differences of loss() with respect to x (perturbed in place, restored);
// prints the worst |analytic - fd| beside the bound at that element.
template <class Loss>
void check_grad(const std::string& what, std::vector<float>& x, const std::vector<float>& grad,
                Loss loss, Rng& rng) {
  REQUIRE(grad.size() == x.size());
  double worst = 0, worst_bound = kFdTol;
  for (size_t k : fd_indices(x.size(), rng)) {
    const float x0 = x[k];
    x[k] = x0 + kFdEps;
    const double lp = loss();
    x[k] = x0 - kFdEps;
    const double lm = loss();
    x[k] = x0;
    const double h = double(x0 + kFdEps) - double(x0 - kFdEps);  // the step taken in fp32
    const double fd = (lp - lm) / h, err = std::abs(grad[k] - fd),
                 bound = kFdTol + kFdTol * std::abs(fd);
    if (!(err <= worst)) worst = err, worst_bound = bound;
    INFO(what << "[" << k << "]: analytic " << grad[k] << ", finite difference " << fd);
    CHECK(err <= bound);
  }
  std::printf("%-66s |analytic - fd| %.2e (bound there %.1e)\n", what.c_str(), worst, worst_bound);
}

}  // namespace strata::optest
