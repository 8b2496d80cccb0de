// The op table's harness, in the manner of ggml's test-backend-ops: the backend under test
// (chosen by --backend, see main.cpp) beside the CPU reference, and OpCase, which runs one op
// on one shape on both from the same host inputs and compares every output. Everything goes
// through the Backend table and its Memory (select_backend, upload, download), never through a
// backend's own functions, so the table works however a backend is linked or loaded.
//
// Error measures, both scale-free; a NaN on one side only is an infinite error, NaN on both
// sides is equal:
//  - NMSE = sum (got - ref)^2 / sum ref^2 (ggml's): the error of the tensor as a whole.
//  - max_rel = max |got - ref| / max |ref|: the worst element, so that one wrong element of a
//    large tensor is not averaged away.
// Tol::close(t) wants max_rel <= t and NMSE <= t^2. Rounding differences are spread thinly
// (most elements far below the worst), so their NMSE sits well under t^2 (a CPU model of bf16
// GEMMs: NMSE 4e-6..2e-5 where max_rel is 2e-3..6e-3); an NMSE near t^2 means nearly every
// element is as far off as the worst one allowed: a systematic error (a scale, a constant
// offset, a missed term), not rounding. max_rel, not NMSE, catches one wrong element of a
// large tensor. Tol::exact() wants every element
// equal as a value (NaN equals NaN, -0 equals +0): masks, argmax, counts, and ops that do the
// same single IEEE operation per element on both sides. Each op's file says why its
// tolerances are what they are.
#pragma once
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/backend.h"

namespace strata::optest {

// ---- The backend under test and the reference -------------------------------------------
// Precision and precision_name: strata's (backend.h).

void set_device(const std::string& device);  // main: "cpu-staged" or "cuda"
const std::string& device();
// What this process ran: OpCases, and outputs compared (main prints them at the end).
struct Tally {
  int cases = 0, comparisons = 0;
};
Tally& tally();
// The CPU backend (fp32): the reference every result is compared with.
const Backend& reference();
// Selects the backend under test in precision p, with STRATA_CUBLASLT set from `cublaslt`
// (0 sends a CUDA backend's GEMMs through cublasGemmEx and strata's own bias/ReLU kernel;
// other backends ignore it).
const Backend& select_target(Precision p, bool cublaslt = true);
// fp32, and bf16 for ops with GEMMs or convolutions where the backend under test offers it
// (select_backend refuses bf16 on the CPU).
std::vector<Precision> precisions(bool gemm);

// ---- Inputs ------------------------------------------------------------------------------
std::vector<float> random_vector(uint64_t seed, size_t n, float lo = -1.f, float hi = 1.f);
std::vector<int32_t> random_ints(uint64_t seed, size_t n, int below);  // uniform in [0, below)
// Values spaced 0.05 apart in random order: a max never changes under a +-1e-2 perturbation.
std::vector<float> distinct_vector(uint64_t seed, size_t n);

// ---- Tolerances --------------------------------------------------------------------------
struct Tol {
  double max_rel = 0;  // 0: exact
  static Tol exact() { return {}; }
  static Tol close(double max_rel) { return {max_rel}; }
  bool is_exact() const { return max_rel == 0; }
  double nmse() const { return max_rel * max_rel; }
};

// ---- OpCase ------------------------------------------------------------------------------
// Handles of an OpCase's tensors; a default one is a null pointer (a gradient not wanted).
struct F32 {
  int id = -1;
};
struct I32 {
  int id = -1;
};

// The pointers an op gets, in the memory of the backend it runs on.
class Ptrs {
 public:
  float* operator[](F32 h) const { return h.id < 0 ? nullptr : static_cast<float*>(p_[h.id]); }
  int32_t* operator[](I32 h) const { return h.id < 0 ? nullptr : static_cast<int32_t*>(p_[h.id]); }
  std::vector<void*> p_;
};

using OpFn = std::function<std::optional<double>(const Backend&, const Ptrs&)>;

class OpCase {
 public:
  // label: op and shape, e.g. "linear_forward B64 I300 O70"; printed with each comparison.
  explicit OpCase(std::string label, Precision p = Precision::fp32);
  // The backend under test gets every buffer one float past an allocation's start (4-byte
  // aligned, as a parameter inside a flat buffer); the reference's stay 64-byte aligned.
  OpCase& misaligned(bool on);
  OpCase& cublaslt(bool on);  // see select_target

  F32 in(std::vector<float> host);
  I32 in(std::vector<int32_t> host);
  // Outputs, NaN-filled (int32: -1) first; see run for how an element left unwritten fails.
  F32 out(std::string name, size_t n, Tol tol);
  I32 out_i32(std::string name, size_t n);  // compared exactly
  // Read and written: starts as `host` on both sides (accumulate, in place, optimizer state).
  F32 inout(std::string name, std::vector<float> host, Tol tol);
  // Scratch of each backend's own size (conv2d_scratch_size), NaN-filled, followed by a guard
  // that must be left as it was: an op may use what its backend asked for and no more.
  F32 scratch(std::function<int64_t(const Backend&)> floats);

  // Runs op(backend, pointers) on the reference and twice on the backend under test, and
  // checks: every output against the reference's; the two runs bitwise the same, the second
  // with its outputs pre-filled with 3e38 instead of NaN (every backend is run-to-run
  // deterministic, and must write every element of an output); inputs untouched; scratch
  // guards intact. An op that returns a host value (a loss, a count, a norm) has it compared
  // within `scalar_tol`, relative.
  template <class Fn>
  void run(Fn op, Tol scalar_tol = Tol::exact()) {
    run_op(
        [&](const Backend& be, const Ptrs& p) -> std::optional<double> {
          if constexpr (std::is_void_v<decltype(op(be, p))>) {
            op(be, p);
            return std::nullopt;
          } else {
            return double(op(be, p));
          }
        },
        scalar_tol);
  }

  // After run: a tensor as the reference and as the backend under test left it.
  const std::vector<float>& ref(F32 h) const { return ref_.f[h.id]; }
  const std::vector<float>& got(F32 h) const { return got_.f[h.id]; }
  const std::vector<int32_t>& ref(I32 h) const { return ref_.i[h.id]; }
  const std::vector<int32_t>& got(I32 h) const { return got_.i[h.id]; }

 private:
  enum class Role { in, out, inout, scratch };
  struct Arg {
    std::string name;
    Role role = Role::in;
    bool i32 = false;
    std::vector<float> f;    // initial values (float tensors)
    std::vector<int32_t> i;  // initial values (int32 tensors)
    Tol tol;
    std::function<int64_t(const Backend&)> scratch_floats;
  };
  // Every tensor after one run, and the returned value.
  struct Result {
    std::vector<std::vector<float>> f;
    std::vector<std::vector<int32_t>> i;
    std::optional<double> scalar;
  };

  int add(std::string name, Role role, std::vector<float> f, std::vector<int32_t> i, bool i32,
          Tol tol);
  void run_op(const OpFn& op, Tol scalar_tol);
  Result run_on(const Backend& be, size_t offset_floats, const OpFn& op, bool second_poison) const;
  void compare_scalar(Tol tol) const;
  void check_repeatable(const Result& again) const;
  void check_untouched(const Result& r, const char* side) const;

  std::string label_;
  Precision precision_;
  bool misaligned_ = false, cublaslt_ = true;
  std::vector<Arg> args_;
  Result ref_, got_;
};

}  // namespace strata::optest
