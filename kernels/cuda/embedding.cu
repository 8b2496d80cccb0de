// GPT-2's input embedding on the GPU: token embedding (wte) plus position embedding (wpe),
// forward and backward, with the contracts of kernels/cpu/embedding.cpp.
//
// Token ids are device int32 and must lie in [0, V): the caller checks them on the host (the
// Embedding layer does, with the CPU's message) since a kernel cannot throw. As a guard, an
// id outside the range gives NaN rows in forward and is skipped in backward (never a read or
// write out of bounds).
//
// Backward is deterministic and gives the CPU's sums bit for bit (the same additions in the
// same order): dwpe[t] = (accumulate ? dwpe[t] : 0) + dout[0,t] + dout[1,t] + ..., one thread
// per (t, channel) adding b in order; dwte by a stable sort of the positions by token (CUB's
// radix sort, stable and deterministic), then one block per distinct token that adds its
// positions' rows in position order, threads across the channels. No float atomics.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

// out (N,C) = wte[tokens[i]] + wpe[i % T]
template <typename I>
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, I N, I T, I C, int V) {
  STRATA_GRID_STRIDE_T(I, idx, N * C) {
    const I i = idx / C, c = idx - i * C;
    const int32_t tok = tokens[i];
    const float p = wpe[(i % T) * C + c];
    out[idx] = tok >= 0 && tok < V ? wte[int64_t(tok) * C + c] + p : __int_as_float(0x7fc00000);
  }
}

// dwpe (T,C) rows [0,T): (accumulate ? dwpe : 0) + sum over b, in order, of dout[b,t]
__global__ void embedding_dwpe_kernel(float* dwpe, const float* dout, int B, int T, int C,
                                      bool accumulate) {
  const int64_t n = int64_t(T) * C;
  STRATA_GRID_STRIDE(tc, n) {
    float s = accumulate ? dwpe[tc] : 0.f;
    for (int b = 0; b < B; ++b) s += dout[int64_t(b) * n + tc];
    dwpe[tc] = s;
  }
}

// The sort's input: keys = token ids (V for an id outside [0,V), sorted last and skipped),
// values = positions 0..N-1.
__global__ void embedding_sort_input_kernel(int32_t* keys, int32_t* positions,
                                            const int32_t* tokens, int N, int V) {
  STRATA_GRID_STRIDE(i, int64_t(N)) {
    const int32_t tok = tokens[i];
    keys[i] = tok >= 0 && tok < V ? tok : V;
    positions[i] = int32_t(i);
  }
}

// One block per sorted position; the block whose position starts a run of equal tokens
// (its key differs from the previous one) owns that token's row of dwte and adds the run's
// rows of dout in position order (the sort is stable), threads across the channels.
__global__ void embedding_dwte_kernel(float* dwte, const float* dout, const int32_t* keys,
                                      const int32_t* positions, int N, int C, int V,
                                      bool accumulate) {
  const int start = blockIdx.x;
  const int32_t v = keys[start];
  if (v >= V || (start > 0 && keys[start - 1] == v)) return;
  int end = start + 1;
  while (end < N && keys[end] == v) ++end;
  float* d = dwte + int64_t(v) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = accumulate ? d[c] : 0.f;
    for (int j = start; j < end; ++j) s += dout[int64_t(positions[j]) * C + c];
    d[c] = s;
  }
}

// Bits that hold the keys 0..V (V is the out-of-range marker).
int key_bits(int V) {
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) <= V) ++bits;
  return bits;
}

}  // namespace

// tokens (B*T, device int32), wte (V,C), wpe (maxT,C) -> out (B,T,C)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int V) {
  const int64_t n = int64_t(B) * T * C;
  if (n == 0) return;
  with_index_type(n, [&](auto index) {
    using I = decltype(index);
    embedding_forward_kernel<I><<<blocks_for(n), kThreads, 0, ctx().stream>>>(
        out, tokens, wte, wpe, I(int64_t(B) * T), I(T), I(C), V);
  });
  STRATA_CUDA_LAUNCHED();
}

// dout (B,T,C), tokens (B*T, device int32) -> dwte (V,C), dwpe rows [0,T) of (maxT,C)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int V, bool accumulate) {
  Context& cx = ctx();
  const int N = B * T;
  if (dwpe && int64_t(T) * C > 0) {
    const int64_t n = int64_t(T) * C;
    embedding_dwpe_kernel<<<blocks_for(n), kThreads, 0, cx.stream>>>(dwpe, dout, B, T, C,
                                                                      accumulate);
    STRATA_CUDA_LAUNCHED();
  }
  if (!dwte || C <= 0) return;
  // Rows of tokens that do not occur: 0, or left as they are.
  if (!accumulate) zero(dwte, sizeof(float) * size_t(V) * size_t(C));
  if (N <= 0) return;
  // Scratch: keys and positions in, keys and positions sorted, then CUB's temporary storage.
  const int bits = key_bits(V);
  size_t sort_bytes = 0;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), N, 0, bits,
      cx.stream));
  const size_t list = (sizeof(int32_t) * size_t(N) + 255) / 256 * 256;
  char* scratch = static_cast<char*>(reduce_scratch(4 * list + sort_bytes));
  auto* keys_in = reinterpret_cast<int32_t*>(scratch);
  auto* pos_in = reinterpret_cast<int32_t*>(scratch + list);
  auto* keys = reinterpret_cast<int32_t*>(scratch + 2 * list);
  auto* pos = reinterpret_cast<int32_t*>(scratch + 3 * list);
  embedding_sort_input_kernel<<<blocks_for(N), kThreads, 0, cx.stream>>>(keys_in, pos_in, tokens,
                                                                          N, V);
  STRATA_CUDA_LAUNCHED();
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch + 4 * list, sort_bytes,
                                                    static_cast<const int32_t*>(keys_in), keys,
                                                    static_cast<const int32_t*>(pos_in), pos, N,
                                                    0, bits, cx.stream));
  const int threads = std::clamp((C + 31) / 32 * 32, 32, 256);
  embedding_dwte_kernel<<<N, threads, 0, cx.stream>>>(dwte, dout, keys, pos, N, C, V,
                                                      accumulate);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
