// Out of memory past the check (memory.h): the process's operator new, host tensors' failures
// and the test hook, all reporting what was being allocated and its size.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "base/memory.h"

namespace strata {
namespace {

thread_local const char* t_scope = nullptr;  // the innermost AllocationScope's label
std::atomic<bool> g_armed{false};             // the test hook applies (a command runs)

// STRATA_TEST_FAIL_ALLOCATION=BYTES[:SCOPE], read once (nothing here allocates): the size
// from which allocations fail, and the text a scope's label must hold for them to fail there.
struct FailPlan {
  size_t at = size_t(-1);
  const char* scope = nullptr;  // into the environment's string
};
const FailPlan& fail_plan() {
  static const FailPlan plan = [] {
    FailPlan p;
    const char* v = std::getenv("STRATA_TEST_FAIL_ALLOCATION");
    if (!v || !*v) return p;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (n == 0 || (*end != '\0' && *end != ':')) return p;
    p.at = size_t(n);
    if (*end == ':') p.scope = end + 1;
    return p;
  }();
  return plan;
}

// "12.0 GiB", without allocating.
void format_size(char* out, size_t cap, size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double b = double(bytes);
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  if (u == 0)
    std::snprintf(out, cap, "%zu B", bytes);
  else
    std::snprintf(out, cap, "%.1f %s", b, units[u]);
}

}  // namespace

OutOfMemory::OutOfMemory(size_t bytes) : bytes_(bytes) {
  char size[32];
  format_size(size, sizeof size, bytes);
  std::snprintf(text_, sizeof text_, "out of memory: could not allocate %s%s%s", size,
                t_scope ? " while " : "", t_scope ? t_scope : "");
}

AllocationScope::AllocationScope(const char* what) : prev_(t_scope) { t_scope = what; }
AllocationScope::~AllocationScope() { t_scope = prev_; }

void arm_allocation_failures(bool on) { g_armed.store(on, std::memory_order_relaxed); }

void check_allocation(size_t bytes) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  const FailPlan& p = fail_plan();
  if (bytes < p.at) return;
  if (p.scope && (!t_scope || !std::strstr(t_scope, p.scope))) return;
  throw OutOfMemory(bytes);
}

}  // namespace strata

// The process's allocation functions: malloc's, with strata's out-of-memory error (and the
// test hook) instead of a bare std::bad_alloc. Deletion is free() for all of them. (Not in
// sanitizer builds, whose runtimes replace them.)
#ifndef STRATA_SANITIZER_NEW
namespace {
void* allocate(std::size_t n) {
  strata::check_allocation(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw strata::OutOfMemory(n);
}
void* allocate_aligned(std::size_t n, std::align_val_t a) {
  strata::check_allocation(n);
  const std::size_t al = std::max(sizeof(void*), static_cast<std::size_t>(a));
  const std::size_t rounded = std::max(al, (n + al - 1) / al * al);  // aligned_alloc's rule
  if (void* p = std::aligned_alloc(al, rounded)) return p;
  throw strata::OutOfMemory(n);
}
}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif  // STRATA_SANITIZER_NEW
