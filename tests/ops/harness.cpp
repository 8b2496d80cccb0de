#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "strata/error.h"
#include "strata/rng.h"

namespace strata::optest {
namespace {

std::string g_device = "cpu-staged";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// What outputs hold before an op runs: NaN on the reference and the first run on the backend
// under test, a finite value on the second. An element an op leaves unwritten differs between
// the two runs (and a NaN poisons whatever reads it).
constexpr float kPoison2 = 3.0e38f;
constexpr int32_t kIntPoison2 = std::numeric_limits<int32_t>::min();
// Scratch guard: floats after a backend's scratch that its ops must not touch.
constexpr size_t kGuardFloats = 64;
constexpr float kGuardValue = -7.25e33f;

// n bytes in a backend's memory, `offset` bytes past the allocation's start.
class Buf {
 public:
  Buf(const Backend& be, size_t bytes, size_t offset) : be_(be), bytes_(bytes) {
    base_ = static_cast<char*>(be.memory->alloc(bytes + offset + 64));
    ptr_ = base_ + offset;
  }
  ~Buf() { be_.memory->release(base_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* get() const { return ptr_; }
  void upload(const void* src) { be_.upload(ptr_, src, bytes_); }
  void download(void* dst) const { be_.download(dst, ptr_, bytes_); }

 private:
  const Backend& be_;
  size_t bytes_;
  char* base_;
  char* ptr_;
};

// How far got is from ref (see harness.h).
struct Error {
  double nmse = 0, max_rel = 0;
  size_t unequal = 0;
};

template <class T>
bool same_value(T a, T b) {
  return a == b || (a != a && b != b);  // NaN equals NaN
}

template <class T>
Error measure(const std::vector<T>& got, const std::vector<T>& ref) {
  Error e;
  double sq_diff = 0, sq_ref = 0, max_diff = 0, max_ref = 0;
  for (size_t k = 0; k < ref.size(); ++k) {
    const bool same = same_value(got[k], ref[k]);
    e.unequal += !same;
    double d = same ? 0.0 : std::fabs(double(got[k]) - double(ref[k]));
    if (std::isnan(d)) d = INFINITY;  // a NaN on one side only, or inf - inf
    sq_diff += d * d;
    max_diff = std::max(max_diff, d);
    if (std::isfinite(double(ref[k]))) {
      sq_ref += double(ref[k]) * double(ref[k]);
      max_ref = std::max(max_ref, std::fabs(double(ref[k])));
    }
  }
  e.nmse = sq_diff == 0 ? 0 : sq_diff / std::max(sq_ref, 1e-300);
  e.max_rel = max_diff == 0 ? 0 : max_diff / std::max(max_ref, 1e-300);
  return e;
}

bool within(const Error& e, Tol tol) {
  return tol.is_exact() ? e.unequal == 0 : e.max_rel <= tol.max_rel && e.nmse <= tol.nmse();
}

// One line per comparison, so that a run's log records the figures.
void report(const std::string& what, Precision p, const Error& e, Tol tol, size_t n) {
  static bool header = false;
  if (!header) {
    std::printf("%-66s %-4s %10s %10s %9s %8s\n", "op: output", "prec", "nmse", "max_rel",
                "tolerance", "unequal");
    header = true;
  }
  const bool ok = within(e, tol);
  ++tally().comparisons;
  const std::string t = tol.is_exact() ? "exact" : fmt::format("{:.1e}", tol.max_rel);
  std::printf("%-66s %-4s %10.3e %10.3e %9s %8zu%s\n", what.c_str(), precision_name(p), e.nmse,
              e.max_rel, t.c_str(), e.unequal, ok ? "" : "  FAIL");
  INFO(what << " [" << precision_name(p) << "] on " << device() << ": nmse " << e.nmse
            << " (tolerance " << tol.nmse() << "), max_rel " << e.max_rel << " (tolerance "
            << tol.max_rel << "), " << e.unequal << " of " << n << " elements differ");
  CHECK(ok);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

Tally& tally() {
  static Tally t;
  return t;
}

void set_device(const std::string& device) { g_device = device; }
const std::string& device() { return g_device; }

const Backend& reference() {
  static const Backend& be = [] {
    DeviceRequest req;
    req.device = "cpu";
    return std::cref(select_backend(req, nullptr));
  }();
  return be;
}

const Backend& select_target(Precision p, bool cublaslt) {
  ::setenv("STRATA_CUBLASLT", cublaslt ? "1" : "0", 1);
  DeviceRequest req;
  req.device = g_device;
  req.precision = precision_name(p);
  return select_backend(req, nullptr);
}

std::vector<Precision> precisions(bool gemm) {
  static const bool has_bf16 = [] {
    try {
      select_target(Precision::bf16);
      return true;
    } catch (const UserError&) {
      return false;
    }
  }();
  if (gemm && has_bf16) return {Precision::fp32, Precision::bf16};
  return {Precision::fp32};
}

std::vector<float> random_vector(uint64_t seed, size_t n, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

std::vector<int32_t> random_ints(uint64_t seed, size_t n, int below) {
  Rng rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = int32_t(rng.below(uint64_t(below)));
  return v;
}

std::vector<float> distinct_vector(uint64_t seed, size_t n) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = 0.05f * (float(k) - float(n / 2));
  for (size_t k = n; k > 1; --k) std::swap(v[k - 1], v[rng.below(k)]);
  return v;
}

// ---- OpCase ------------------------------------------------------------------------------

OpCase::OpCase(std::string label, Precision p) : label_(std::move(label)), precision_(p) {}

OpCase& OpCase::misaligned(bool on) {
  misaligned_ = on;
  return *this;
}

OpCase& OpCase::cublaslt(bool on) {
  cublaslt_ = on;
  return *this;
}

int OpCase::add(std::string name, Role role, std::vector<float> f, std::vector<int32_t> i, bool i32,
                Tol tol) {
  Arg a;
  a.name = std::move(name);
  a.role = role;
  a.f = std::move(f);
  a.i = std::move(i);
  a.i32 = i32;
  a.tol = tol;
  args_.push_back(std::move(a));
  return int(args_.size()) - 1;
}

F32 OpCase::in(std::vector<float> host) {
  return {add("input", Role::in, std::move(host), {}, false, Tol::exact())};
}

I32 OpCase::in(std::vector<int32_t> host) {
  return {add("input", Role::in, {}, std::move(host), true, Tol::exact())};
}

F32 OpCase::out(std::string name, size_t n, Tol tol) {
  return {add(std::move(name), Role::out, std::vector<float>(n, kNaN), {}, false, tol)};
}

I32 OpCase::out_i32(std::string name, size_t n) {
  return {add(std::move(name), Role::out, {}, std::vector<int32_t>(n, -1), true, Tol::exact())};
}

F32 OpCase::inout(std::string name, std::vector<float> host, Tol tol) {
  return {add(std::move(name), Role::inout, std::move(host), {}, false, tol)};
}

F32 OpCase::scratch(std::function<int64_t(const Backend&)> floats) {
  const int k = add("scratch", Role::scratch, {}, {}, false, Tol::exact());
  args_[size_t(k)].scratch_floats = std::move(floats);
  return {k};
}

OpCase::Result OpCase::run_on(const Backend& be, size_t offset_floats, const OpFn& op,
                              bool second_poison) const {
  std::vector<std::unique_ptr<Buf>> bufs;
  Ptrs p;
  for (const Arg& a : args_) {
    std::vector<float> f = a.f;
    std::vector<int32_t> i = a.i;
    if (a.role == Role::out && second_poison) {
      std::fill(f.begin(), f.end(), kPoison2);
      std::fill(i.begin(), i.end(), kIntPoison2);
    }
    if (a.role == Role::scratch) {
      const int64_t n = a.scratch_floats(be);
      REQUIRE(n >= 0);
      f.assign(size_t(n), kNaN);  // reading what the op did not write poisons its result
      f.resize(size_t(n) + kGuardFloats, kGuardValue);
    }
    const size_t bytes = a.i32 ? a.i.size() * 4 : f.size() * 4;
    bufs.push_back(std::make_unique<Buf>(be, bytes, offset_floats * 4));
    bufs.back()->upload(a.i32 ? static_cast<const void*>(i.data()) : f.data());
    p.p_.push_back(bufs.back()->get());
  }
  Result r;
  r.scalar = op(be, p);
  r.f.resize(args_.size());
  r.i.resize(args_.size());
  for (size_t k = 0; k < args_.size(); ++k) {
    if (args_[k].i32) {
      r.i[k].resize(args_[k].i.size());
      bufs[k]->download(r.i[k].data());
    } else {
      const int64_t n = args_[k].role == Role::scratch ? args_[k].scratch_floats(be) : 0;
      r.f[k].resize(args_[k].role == Role::scratch ? size_t(n) + kGuardFloats : args_[k].f.size());
      bufs[k]->download(r.f[k].data());
    }
  }
  return r;
}

void OpCase::run_op(const OpFn& op, Tol scalar_tol) {
  ++tally().cases;
  const size_t offset = misaligned_ ? 1 : 0;
  ref_ = run_on(reference(), 0, op, false);
  got_ = run_on(select_target(precision_, cublaslt_), offset, op, false);
  const Result again = run_on(select_target(precision_, cublaslt_), offset, op, true);
  for (size_t k = 0; k < args_.size(); ++k) {
    const Arg& a = args_[k];
    if (a.role != Role::out && a.role != Role::inout) continue;
    const std::string what = label_ + ": " + a.name;
    if (a.i32)
      report(what, precision_, measure(got_.i[k], ref_.i[k]), Tol::exact(), a.i.size());
    else
      report(what, precision_, measure(got_.f[k], ref_.f[k]), a.tol, a.f.size());
  }
  if (ref_.scalar || got_.scalar) compare_scalar(scalar_tol);
  check_repeatable(again);
  check_untouched(ref_, "the reference");
  check_untouched(got_, device().c_str());
}

// A returned value (a loss, a count, a norm), relative to the reference's.
void OpCase::compare_scalar(Tol tol) const {
  REQUIRE((ref_.scalar && got_.scalar));
  const double got = *got_.scalar, ref = *ref_.scalar;
  Error e;
  e.unequal = !same_value(got, ref);
  e.max_rel = e.unequal ? std::fabs(got - ref) / std::max(std::fabs(ref), 1e-300) : 0;
  e.nmse = e.max_rel * e.max_rel;
  INFO(label_ << ": returned " << got << ", the reference " << ref);
  report(label_ + ": returned value", precision_, e, tol, 1);
}

// The backend under test gives bitwise the same outputs when run again, its outputs pre-filled
// with another value.
void OpCase::check_repeatable(const Result& again) const {
  for (size_t k = 0; k < args_.size(); ++k) {
    if (args_[k].role != Role::out && args_[k].role != Role::inout) continue;
    const bool same =
        args_[k].i32 ? bitwise_equal(again.i[k], got_.i[k]) : bitwise_equal(again.f[k], got_.f[k]);
    INFO(label_ << ": " << args_[k].name << " on " << device() << " [" << precision_name(precision_)
                << "] differs between two runs of the same op "
                << "(the second with its outputs pre-filled with 3e38 instead of NaN): not "
                << "deterministic, or an element left unwritten");
    CHECK(same);
  }
  const bool same_scalar =
      again.scalar.has_value() == got_.scalar.has_value() &&
      (!again.scalar || std::memcmp(&*again.scalar, &*got_.scalar, sizeof(double)) == 0);
  INFO(label_ << ": the returned value differs between two runs on " << device());
  CHECK(same_scalar);
}

// Inputs as they were uploaded; scratch guards as they were.
void OpCase::check_untouched(const Result& r, const char* side) const {
  for (size_t k = 0; k < args_.size(); ++k) {
    const Arg& a = args_[k];
    if (a.role == Role::in) {
      const bool same = a.i32 ? bitwise_equal(r.i[k], a.i) : bitwise_equal(r.f[k], a.f);
      INFO(label_ << ": " << side << " wrote into an input (tensor " << k << ")");
      CHECK(same);
    } else if (a.role == Role::scratch) {
      const auto& f = r.f[k];
      const bool guard_intact =
          std::all_of(f.end() - kGuardFloats, f.end(), [](float v) { return v == kGuardValue; });
      INFO(label_ << ": " << side << " wrote past the scratch its conv2d_scratch_size asked for");
      CHECK(guard_intact);
    }
  }
}

}  // namespace strata::optest
