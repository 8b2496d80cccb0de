// sgemm through OpenBLAS, loaded at run time.
//
// Why dlopen instead of linking: OpenBLAS (DYNAMIC_ARCH builds, as Debian ships) picks its
// kernels once, in a constructor that runs when the library is loaded, from the CPU model.
// Virtual machines often report a generic model name, and OpenBLAS then falls back to its
// Prescott (SSE3) kernels: ~5x slower sgemm on a CPU that has AVX-512. The override,
// OPENBLAS_CORETYPE, is read by that same constructor, so with a linked library it would have to
// be set before the process starts; setenv in main() is too late. Loading the library ourselves
// lets us detect the CPU features with cpuid and set the variable first. The thread count is
// set the same way, so that OpenBLAS does not start a pool of one thread per core under MPI.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "strata/kernels_cpu.h"

namespace strata::cpu {
namespace {

// The CBLAS enum values (cblas.h), so no OpenBLAS header is needed at build time.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using SgemmFn = void (*)(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                         const float* A, int lda, const float* B, int ldb, float beta, float* C,
                         int ldc);
using SetThreadsFn = void (*)(int);
using CorenameFn = char* (*)();

std::once_flag g_load_once;
std::mutex g_threads_mu;
std::atomic<SgemmFn> g_sgemm{nullptr};  // non-null once loaded (stored last, release)
SetThreadsFn g_set_threads = nullptr;
CorenameFn g_corename = nullptr;

// OpenBLAS's name for the best kernel set this CPU (and OS) supports, or null to let OpenBLAS
// decide. __builtin_cpu_supports also checks that the OS saves the AVX/AVX-512 register state.
const char* detect_coretype() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

void load_openblas(int threads) {
  // A coretype the user set wins: it is the documented way to work around a bad choice.
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* core = detect_coretype()) setenv("OPENBLAS_CORETYPE", core, 0);
  // Sizes the thread pool OpenBLAS starts at load (default: one per core, wasted under MPI).
  setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);

  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    throw std::runtime_error(std::string("cannot load OpenBLAS (libopenblas.so.0): ") +
                             dlerror() + "; install libopenblas0 or set LD_LIBRARY_PATH");
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
  auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(lib, "openblas_set_num_threads"));
  auto corename = reinterpret_cast<CorenameFn>(dlsym(lib, "openblas_get_corename"));
  if (!sgemm || !set_threads || !corename)
    throw std::runtime_error(
        "libopenblas.so.0 lacks cblas_sgemm/openblas_set_num_threads/openblas_get_corename; "
        "is it really OpenBLAS?");
  g_set_threads = set_threads;
  g_corename = corename;
  g_sgemm.store(sgemm, std::memory_order_release);
}

}  // namespace

void blas_init(int threads) {
  threads = std::max(threads, 1);
  // call_once: a throwing load leaves the flag unset, so a later call retries.
  std::call_once(g_load_once, load_openblas, threads);
  // The environment variable only sizes the pool at load; later calls may change the count.
  std::lock_guard<std::mutex> lock(g_threads_mu);
  g_set_threads(threads);
}

const char* blas_corename() {
  if (!g_sgemm.load(std::memory_order_acquire)) blas_init(1);
  return g_corename();
}

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // op(A) op(B) is empty: C = beta*C, and beta == 0 overwrites (C may be uninitialised).
    for (int i = 0; i < M; ++i) {
      float* c = C + int64_t(i) * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == 0 ? 0.f : beta * c[j];
    }
    return;
  }
  SgemmFn gemm = g_sgemm.load(std::memory_order_acquire);
  if (!gemm) {
    blas_init(1);
    gemm = g_sgemm.load(std::memory_order_acquire);
  }
  gemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, M, N, K, alpha, A,
       lda, B, ldb, beta, C, ldc);
}

}  // namespace strata::cpu
