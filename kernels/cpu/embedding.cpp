// GPT-2's input embedding: a token embedding (wte) plus a learned position embedding (wpe),
// forward and backward.
//
// Backward is a scatter-add (many rows may carry the same token). Every gradient element is
// summed in one fixed order, the order of the rows, whatever the threads: threads own disjoint
// column ranges of dwte (whole cache lines) and walk all rows, so no two threads ever add to
// the same element and the result is that of the plain sequential loop.
#include <omp.h>

#include <algorithm>

#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata::cpu {

namespace {

// Below this many elements the work is not worth waking threads for.
constexpr int64_t kParallelMin = int64_t(1) << 15;

void check_tokens(const int32_t* tokens, int B, int T, int V) {
  for (int64_t i = 0; i < int64_t(B) * T; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      fail_input("token {} at batch row {}, position {} is outside the vocabulary [0, {})",
                 tokens[i], i / T, i % T, V);
}

}  // namespace

// tokens (B*T), wte (V,C), wpe (maxT,C) -> out (B,T,C)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int V) {
  check_tokens(tokens, B, T, V);  // before the parallel loop: an exception may not leave it
  const int64_t N = int64_t(B) * T;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* e = wte + int64_t(tokens[i]) * C;
    const float* p = wpe + (i % T) * C;
    float* o = out + i * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

// dout (B,T,C), tokens (B*T) -> dwte (V,C), dwpe rows [0,T) of (maxT,C)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int V, bool accumulate) {
  const int64_t N = int64_t(B) * T;
  if (dwpe) {
    // dwpe[t] = (accumulate ? dwpe[t] : 0) + dout[0,t] + dout[1,t] + ... + dout[B-1,t]
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (int t = 0; t < T; ++t) {
      float* d = dwpe + int64_t(t) * C;
      if (!accumulate) std::fill(d, d + C, 0.f);
      for (int b = 0; b < B; ++b) {
        const float* g = dout + (int64_t(b) * T + t) * C;
        for (int c = 0; c < C; ++c) d[c] += g[c];
      }
    }
  }
  if (dwte) {
    check_tokens(tokens, B, T, V);
    const int64_t lines = (C + 15) / 16;  // 16 floats = one 64-byte cache line
#pragma omp parallel if (N * C >= kParallelMin)
    {
      if (!accumulate) {
#pragma omp for schedule(static)
        for (int v = 0; v < V; ++v)
          std::fill(dwte + int64_t(v) * C, dwte + int64_t(v + 1) * C, 0.f);
      }  // (the loop's barrier: all rows are zero before any thread adds)
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int c0 = int(std::min<int64_t>(C, lines * id / nt * 16));
      const int c1 = int(std::min<int64_t>(C, lines * (id + 1) / nt * 16));
      for (int64_t i = 0; i < N; ++i) {
        float* d = dwte + int64_t(tokens[i]) * C;
        const float* g = dout + i * C;
        for (int c = c0; c < c1; ++c) d[c] += g[c];
      }
    }
  }
}

}  // namespace strata::cpu
