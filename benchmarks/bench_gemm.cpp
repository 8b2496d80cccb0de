// strata's GEMM (oneDNN's sgemm) against OpenBLAS on the shapes of a training step, in the same
// run. OpenBLAS is loaded with dlopen after setting OPENBLAS_CORETYPE from cpuid, so it gets
// its fastest kernels too (on VMs its own detection falls back to SSE3: ../shared/FACTS.md).
// Each figure is the median of N calls of thread CPU time (robust to other processes).
//   usage: bench_gemm [calls (default 60)]        needs libopenblas0 installed for the baseline
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strata/kernels_cpu.h"

namespace {

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // cblas.h

double thread_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

template <class F>
double median_s(int n, F f) {
  f();  // warm-up
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const double t0 = thread_s();
    f();
    v.push_back(thread_s() - t0);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

CblasSgemm load_openblas(const char** core) {
  __builtin_cpu_init();
  // The fastest kernels for this CPU, whatever OPENBLAS_CORETYPE the environment brings (an
  // image here set Haswell on an AVX-512 CPU); BENCH_OPENBLAS_CORETYPE chooses explicitly.
  if (const char* c = getenv("BENCH_OPENBLAS_CORETYPE"); c && *c)
    setenv("OPENBLAS_CORETYPE", c, 1);
  else if (__builtin_cpu_supports("avx512f"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  else if (__builtin_cpu_supports("avx2"))
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto name = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
  *core = name ? name() : "?";
  return reinterpret_cast<CblasSgemm>(dlsym(lib, "cblas_sgemm"));
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 60;
  strata::cpu::blas_init(1);
  const char* core = "";
  CblasSgemm openblas = load_openblas(&core);
  if (!openblas) {
    std::fprintf(stderr, "bench_gemm: libopenblas.so.0 not found (apt-get install libopenblas0)\n");
    return 1;
  }
  std::printf("strata: %s   baseline: OpenBLAS %s, 1 thread, median of %d calls\n",
              strata::cpu::blas_corename(), core, calls);
  struct Shape {
    bool ta, tb;
    int M, N, K;
    const char* what;
  };
  const Shape shapes[] = {
      {false, true, 64, 256, 784, "MLP fc1 forward"},   {true, false, 256, 784, 64, "MLP fc1 dW"},
      {false, true, 64, 128, 256, "MLP fc2 forward"},   {false, false, 64, 256, 128, "MLP fc2 dX"},
      {true, false, 128, 256, 64, "MLP fc2 dW"},        {false, false, 64, 196, 288, "CNN conv2 fwd/sample"},
      {false, true, 64, 288, 196, "CNN conv2 dW/sample"}, {true, false, 288, 196, 64, "CNN conv2 dcols/sample"},
      // The GPT of benchmarks/bench_gpt.py (batch 8 x 256 positions, dim 384): y = x W^T,
      // dX = dY W, dW = dY^T X for c_attn (1152 x 384) and c_fc (1536 x 384).
      {false, true, 2048, 1152, 384, "GPT c_attn forward"}, {false, false, 2048, 384, 1152, "GPT c_attn dX"},
      {true, false, 1152, 384, 2048, "GPT c_attn dW"},      {false, true, 2048, 1536, 384, "GPT c_fc forward"},
      {false, false, 2048, 384, 1536, "GPT c_fc dX"},       {true, false, 1536, 384, 2048, "GPT c_fc dW"},
  };
  std::printf("%-24s %10s %9s %10s %9s %7s\n", "shape (M,N,K)", "strata us", "GFLOP/s", "OpenBLAS us",
              "GFLOP/s", "ratio");
  for (const Shape& s : shapes) {
    std::vector<float> A(size_t(s.M) * s.K, 0.25f), B(size_t(s.K) * s.N, 0.5f), C1(size_t(s.M) * s.N),
        C2(size_t(s.M) * s.N);
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const double a = median_s(calls, [&] {
      strata::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C1.data(), s.N);
    });
    const double b = median_s(calls, [&] {
      openblas(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N, s.K, 1.f,
               A.data(), lda, B.data(), ldb, 0.f, C2.data(), s.N);
    });
    double err = 0, scale = 0;  // validate: both computed the same product
    for (size_t i = 0; i < C1.size(); ++i) {
      err = std::max(err, double(std::abs(C1[i] - C2[i])));
      scale = std::max(scale, double(std::abs(C2[i])));
    }
    if (!(err <= 1e-5 * scale)) {
      std::fprintf(stderr, "bench_gemm: %s: results differ (%g of %g)\n", s.what, err, scale);
      return 1;
    }
    const double gf = 2.0 * s.M * s.N * s.K * 1e-9;
    std::printf("%-24s %10.1f %9.0f %10.1f %9.0f %6.2fx\n", s.what, a * 1e6, gf / a, b * 1e6, gf / b, b / a);
  }
}
