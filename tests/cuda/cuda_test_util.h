// Helpers of the CUDA-vs-CPU tests: device buffers, random inputs, the precision switch and
// the error checks, which print one line per comparison (op, precision, measured error,
// tolerance) so that a GPU run's log records the figures.
//
// Error measure: norm-wise relative, max_i |cuda_i - cpu_i| / max_i |cpu_i| (a NaN where the
// CPU has a number counts as infinite error). Scale-free, and a wrong index or transposition
// gives O(1), far above every tolerance used.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/kernels_cuda.h"
#include "strata/rng.h"

namespace strata::cuda_test {

// n elements of T on the device, `offset` elements past an allocation's start (offset 1 gives
// a 4-byte aligned float buffer, like a parameter inside a flat buffer).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, size_t offset = 0) : n_(n) {
    base_ = static_cast<T*>(cuda::alloc(sizeof(T) * (n + offset + 1)));
    ptr_ = base_ + offset;
  }
  DeviceBuffer(const std::vector<T>& host, size_t offset = 0) : DeviceBuffer(host.size(), offset) {
    upload(host);
  }
  ~DeviceBuffer() { cuda::release(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    cuda::upload(ptr_, host.data(), sizeof(T) * n_);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda::download(host.data(), ptr_, sizeof(T) * n_);
    return host;
  }

 private:
  T* base_ = nullptr;
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_vector(uint64_t seed, size_t n, float lo = -1.f, float hi = 1.f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Makes device 0 current in the given precision; lt = false sends every GEMM through
// cublasGemmEx with strata's own bias/ReLU kernel (STRATA_CUBLASLT=0, read by init).
inline void use_precision(bool bf16, bool lt = true) {
  setenv("STRATA_CUBLASLT", lt ? "1" : "0", 1);
  cuda::init(0, bf16);
}
inline const char* precision_name(bool bf16) { return bf16 ? "bf16" : "fp32"; }

inline double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool same = got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));
    double d = same ? 0.0 : std::fabs(double(got[i]) - double(ref[i]));
    if (std::isnan(d)) d = INFINITY;  // a NaN on one side only, or inf - inf
    max_diff = std::max(max_diff, d);
    if (std::isfinite(ref[i])) max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// Elements that are not bitwise-equal as values (NaN equals NaN, -0 equals +0).
template <typename T>
size_t count_different(const std::vector<T>& got, const std::vector<T>& ref) {
  REQUIRE(got.size() == ref.size());
  size_t n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool both_nan = got[i] != got[i] && ref[i] != ref[i];
    if (!(got[i] == ref[i]) && !both_nan) ++n;
  }
  return n;
}

inline void print_header_once() {
  static bool printed = false;
  if (printed) return;
  printed = true;
  std::printf("%-58s %-5s %10s %9s %8s\n", "op", "prec", "error", "tolerance", "unequal");
}

// CUDA result against the CPU reference, norm-wise, within `tol`; also prints how many
// elements differ at all.
inline void check_close(const std::string& op, bool bf16, const std::vector<float>& got,
                        const std::vector<float>& ref, double tol) {
  const double err = relative_error(got, ref);
  const size_t unequal = count_different(got, ref);
  print_header_once();
  std::printf("%-58s %-5s %10.3e %9.1e %8zu%s\n", op.c_str(), precision_name(bf16), err, tol,
              unequal, err <= tol ? "" : "  FAIL");
  INFO(op << " [" << precision_name(bf16) << "]: max|cuda-cpu|/max|cpu| = " << err
          << ", tolerance " << tol << ", " << unequal << " of " << ref.size()
          << " elements differ");
  CHECK(err <= tol);
}

// CUDA result equal to the CPU's element for element (ops with the same roundings).
template <typename T>
void check_equal(const std::string& op, bool bf16, const std::vector<T>& got,
                 const std::vector<T>& ref) {
  const size_t unequal = count_different(got, ref);
  print_header_once();
  std::printf("%-58s %-5s %10s %9s %8zu%s\n", op.c_str(), precision_name(bf16), "exact", "0",
              unequal, unequal == 0 ? "" : "  FAIL");
  INFO(op << " [" << precision_name(bf16) << "]: " << unequal << " of " << ref.size()
          << " elements differ (exact match expected)");
  CHECK(unequal == 0);
}

// A scalar (loss, norm) within a relative tolerance.
inline void check_scalar(const std::string& op, bool bf16, double got, double ref, double tol) {
  const double err = std::fabs(got - ref) / std::max(std::fabs(ref), 1e-300);
  print_header_once();
  std::printf("%-58s %-5s %10.3e %9.1e %8s%s\n", op.c_str(), precision_name(bf16), err, tol, "-",
              err <= tol ? "" : "  FAIL");
  INFO(op << " [" << precision_name(bf16) << "]: cuda " << got << ", cpu " << ref
          << ", relative error " << err << ", tolerance " << tol);
  CHECK(err <= tol);
}

}  // namespace strata::cuda_test
