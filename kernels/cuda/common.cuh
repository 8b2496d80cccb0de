// What every kernels/cuda/*.cu shares: the error checks, the process's CUDA context (device,
// stream, library handles, precision) and the launch shape of elementwise kernels.
// Internal to kernels/cuda: host code outside it uses strata/kernels_cuda.h only.
// (No fmt here: fmt 9's consteval format strings do not compile under nvcc.)
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "strata/kernels_cuda.h"

namespace strata::cuda::detail {

// ---- Error checks ----------------------------------------------------------------------
// Throw std::runtime_error("file:line: <call> failed: <library> <error name>: <message>").
[[noreturn]] void fail(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail(cublasStatus_t e, const char* call, const char* file, int line);
[[noreturn]] void fail(cudnnStatus_t e, const char* call, const char* file, int line);

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) fail(e, call, file, line);
}
inline void check(cublasStatus_t e, const char* call, const char* file, int line) {
  if (e != CUBLAS_STATUS_SUCCESS) fail(e, call, file, line);
}
inline void check(cudnnStatus_t e, const char* call, const char* file, int line) {
  if (e != CUDNN_STATUS_SUCCESS) fail(e, call, file, line);
}

}  // namespace strata::cuda::detail

// Every CUDA runtime, cuBLAS(Lt) and cuDNN call goes through this (the status type picks the
// library's error strings).
#define STRATA_CUDA_CHECK(call) ::strata::cuda::detail::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration at once (errors inside the kernel
// surface at the next synchronising call).
#define STRATA_CUDA_LAUNCHED() STRATA_CUDA_CHECK(cudaGetLastError())

namespace strata::cuda::detail {

// ---- The context (context.cu) ----------------------------------------------------------
// One per process, made by init(). Ops are issued from one thread at a time (the training
// loop); other threads may call the memory functions (ctx() makes the device current on them).
struct Context {
  int device = -1;
  bool bf16 = false;           // GEMMs and convolutions compute in bf16 (Bf16Scope); plans
                               // are cached per precision
  bool use_lt = true;          // cuBLASLt for GEMMs (env STRATA_CUBLASLT=0: cublasGemmEx only)
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt's workspace (kLtWorkspaceBytes)
  size_t lt_workspace_bytes = 0;
  void* reduce_buf = nullptr;    // device scratch of the reductions that return a host value
  size_t reduce_bytes = 0;
  void* host_result = nullptr;   // pinned, kHostResultBytes: where those values land
};
constexpr size_t kHostResultBytes = 64;

// The initialised context; throws std::logic_error if init() has not run.
Context& ctx();
// Device scratch of at least `bytes` for one op's reduction (grown on demand; the same
// buffer for every op: ops run in stream order, one at a time).
void* reduce_scratch(size_t bytes);
// A buffer of `bytes` replacing `old` (null: none): both stream-ordered on the compute stream,
// so the old one is freed after the ops queued before and nothing waits for the device.
void* grow(void* old, size_t bytes);
// Copies `bytes` (<= kHostResultBytes) from device `src` to ctx().host_result and waits.
const void* fetch_result(const void* src, size_t bytes);

// ---- Launch shapes ---------------------------------------------------------------------
constexpr int kThreads = 256;
// Blocks for an elementwise grid-stride kernel over n items: one item per thread up to
// 32 blocks per SM, then the threads loop (kernels use 64-bit indices throughout).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t want = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(want, 1, int64_t(ctx().sm_count) * 32));
}

#define STRATA_GRID_STRIDE(i, n) STRATA_GRID_STRIDE_T(int64_t, i, n)
// The same with index type I (int32_t or int64_t, see with_index_type).
#define STRATA_GRID_STRIDE_T(I, i, n)                                                    \
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < (n);                    \
       i += I(gridDim.x) * I(blockDim.x))

// Calls f(int32_t{}) when indices below n fit comfortably in 32 bits (with room for a grid
// stride past n), else f(int64_t{}). Kernels that divide an element index (to find its row,
// channel or plane) use it: 64-bit integer division is a long emulated instruction sequence,
// enough to make a memory-bound kernel compute-bound.
template <typename F>
void with_index_type(int64_t n, F f) {
  if (n < (int64_t(1) << 30))
    f(int32_t{});
  else
    f(int64_t{});
}

// ---- Warp and block reductions ---------------------------------------------------------
template <typename T>
__device__ inline T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); the result is valid in thread 0.
// The order is fixed by the launch shape, so results are run-to-run deterministic. Uses one
// shared array: a kernel that calls it twice needs a __syncthreads() between the calls.
template <typename T>
__device__ inline T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : T(0);
  if (warp == 0) v = warp_sum(v);
  return v;
}

}  // namespace strata::cuda::detail
