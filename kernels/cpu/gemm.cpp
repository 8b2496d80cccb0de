// sgemm through oneDNN's JIT GEMM (dnnl_sgemm).
//
// Why oneDNN and not OpenBLAS: on the shapes a training step has (batch 64 against layers of
// 128-1024, per-sample conv GEMMs with K = C*9), oneDNN's sgemm measured 10-40% faster than
// OpenBLAS 0.3.21's SkylakeX kernels (benchmarks/bench_kernels.cpp, README "Libraries"). It
// also chooses its kernels from the CPU's instruction-set flags (cpuid), where OpenBLAS's
// DYNAMIC_ARCH goes by the CPU model name and falls back to SSE3 kernels, 5x slower, on VMs that
// report a generic model; strata therefore runs fast with no environment variable to know.
// oneDNN's CPU runtime in Debian is OpenMP: its thread count is the OpenMP one.
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "strata/kernels_cpu.h"

namespace strata::cpu {

void blas_init(int threads) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  // Without this OpenMP starts one thread per core in every rank: oversubscribed under MPI.
  omp_set_num_threads(threads < 1 ? 1 : threads);
}

const char* blas_corename() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "oneDNN avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "oneDNN avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "oneDNN avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "oneDNN avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "oneDNN avx2_vnni";
    case dnnl_cpu_isa_avx2: return "oneDNN avx2";
    case dnnl_cpu_isa_avx: return "oneDNN avx";
    case dnnl_cpu_isa_sse41: return "oneDNN sse41";
    default: return "oneDNN";
  }
}

// C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C, all row-major.
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A)*op(B) is zero: C = beta*C (beta 0 clears C, even of NaNs)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw std::runtime_error(fmt::format("dnnl_sgemm({}, {}, M={}, N={}, K={}) failed: status {}",
                                         trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, int(st)));
}

}  // namespace strata::cpu
