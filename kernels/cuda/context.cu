// The process's CUDA context: device, the one compute stream, the cuBLAS/cuBLASLt/cuDNN
// handles and the precision; the error checks; device memory; add_inplace.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common.cuh"

namespace strata::cuda {

namespace detail {

namespace {

Context g_ctx;
std::atomic<bool> g_initialized{false};
std::mutex g_mutex;               // init() and the growth of reduce_buf
thread_local int t_device = -1;   // the device this thread last made current

// cuBLAS's recommended workspace for Hopper (cuBLAS docs, "cublasSetWorkspace": 32 MiB).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

std::string where(const char* call, const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: ";
}

// STRATA_CUBLASLT=0 routes every GEMM through cublasGemmEx with strata's own bias/ReLU kernel
// (the path taken anyway when cuBLASLt has no algorithm for a shape); the tests use it to
// check that path too.
bool lt_enabled() {
  const char* v = std::getenv("STRATA_CUBLASLT");
  return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace

void fail(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear it, so the next launch check does not report it again
  throw std::runtime_error(where(call, file, line) + "CUDA " + cudaGetErrorName(e) + ": " +
                           cudaGetErrorString(e));
}

void fail(cublasStatus_t e, const char* call, const char* file, int line) {
  throw std::runtime_error(where(call, file, line) + "cuBLAS " + cublasGetStatusName(e) + ": " +
                           cublasGetStatusString(e));
}

void fail(cudnnStatus_t e, const char* call, const char* file, int line) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);  // cuDNN 9: the reason, when it has one
  std::string msg = where(call, file, line) + "cuDNN " + cudnnGetErrorString(e);
  if (detail[0]) msg += std::string(" (") + detail + ")";
  throw std::runtime_error(msg);
}

Context& ctx() {
  if (!g_initialized.load(std::memory_order_acquire))
    throw std::logic_error("strata::cuda: init() has not been called");
  if (t_device != g_ctx.device) {
    STRATA_CUDA_CHECK(cudaSetDevice(g_ctx.device));
    t_device = g_ctx.device;
  }
  return g_ctx;
}

void* reduce_scratch(size_t bytes) {
  Context& c = ctx();
  std::lock_guard lock(g_mutex);
  if (bytes > c.reduce_bytes) {
    const size_t want = std::max<size_t>(bytes, size_t(64) << 10);
    c.reduce_buf = grow(c.reduce_buf, want);
    c.reduce_bytes = want;
  }
  return c.reduce_buf;
}

void* grow(void* old, size_t bytes) {
  Context& c = ctx();
  if (old) STRATA_CUDA_CHECK(cudaFreeAsync(old, c.stream));
  void* p = nullptr;
  STRATA_CUDA_CHECK(cudaMallocAsync(&p, bytes, c.stream));
  return p;
}

const void* fetch_result(const void* src, size_t bytes) {
  Context& c = ctx();
  if (bytes > kHostResultBytes) throw std::logic_error("fetch_result: too many bytes");
  STRATA_CUDA_CHECK(cudaMemcpyAsync(c.host_result, src, bytes, cudaMemcpyDeviceToHost, c.stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return c.host_result;
}

}  // namespace detail

using detail::ctx;

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime sees no device";
  return n;
}

void init(int device) {
  using detail::g_ctx;
  std::lock_guard lock(detail::g_mutex);
  if (detail::g_initialized.load(std::memory_order_acquire)) {
    if (device != g_ctx.device)
      throw std::logic_error("strata::cuda::init: already initialised on device " +
                             std::to_string(g_ctx.device) + ", asked for device " +
                             std::to_string(device));
    g_ctx.use_lt = detail::lt_enabled();
    return;
  }
  std::string why;
  const int n = device_count(&why);
  if (device < 0 || device >= n)
    throw std::runtime_error("strata::cuda::init: no CUDA device " + std::to_string(device) +
                             " (" + std::to_string(n) + " visible" +
                             (why.empty() ? "" : ": " + why) + ")");
  detail::Context c;
  c.device = device;
  c.use_lt = detail::lt_enabled();
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&c.sm_count, cudaDevAttrMultiProcessorCount, device));
  // A blocking stream: it still orders with work other code puts on the legacy default stream.
  STRATA_CUDA_CHECK(cudaStreamCreate(&c.stream));
  STRATA_CUDA_CHECK(cublasCreate(&c.cublas));
  STRATA_CUDA_CHECK(cublasSetStream(c.cublas, c.stream));
  // Default math: with CUBLAS_COMPUTE_32F no TF32 (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH or
  // COMPUTE_32F_FAST_TF32); in a Bf16Scope GEMMs ask for CUBLAS_COMPUTE_32F_FAST_16BF per call.
  STRATA_CUDA_CHECK(cublasSetMathMode(c.cublas, CUBLAS_DEFAULT_MATH));
  STRATA_CUDA_CHECK(cublasLtCreate(&c.lt));
  STRATA_CUDA_CHECK(cudaMalloc(&c.lt_workspace, detail::kLtWorkspaceBytes));
  c.lt_workspace_bytes = detail::kLtWorkspaceBytes;
  STRATA_CUDA_CHECK(cudnnCreate(&c.cudnn));
  STRATA_CUDA_CHECK(cudnnSetStream(c.cudnn, c.stream));
  STRATA_CUDA_CHECK(cudaMallocHost(&c.host_result, detail::kHostResultBytes));
  // Memory freed to the default pool stays there (a step's frees feed the next step's
  // allocations without returning to the driver).
  cudaMemPool_t pool = nullptr;
  STRATA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  // The context lives until the process exits: handles are not destroyed at exit on purpose
  // (static destructors would run after the CUDA runtime may have shut down).
  g_ctx = c;
  detail::t_device = device;
  detail::g_initialized.store(true, std::memory_order_release);
}

bool initialized() { return detail::g_initialized.load(std::memory_order_acquire); }

Bf16Scope::Bf16Scope(bool bf16) : previous_(detail::ctx().bf16) { detail::ctx().bf16 = bf16; }
Bf16Scope::~Bf16Scope() { detail::ctx().bf16 = previous_; }

int current_device() { return initialized() ? detail::g_ctx.device : -1; }

std::string device_name() {
  const int device = initialized() ? ctx().device : 0;
  cudaDeviceProp prop;
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void* stream() { return ctx().stream; }

void synchronize() { STRATA_CUDA_CHECK(cudaStreamSynchronize(ctx().stream)); }

// ---- Memory ----------------------------------------------------------------------------

// Stream-ordered, from the device's default memory pool (its release threshold raised at init
// so freed memory stays in the pool): neither allocating nor freeing waits for the device, so
// a free never waits for an NCCL collective in flight on the communicator's stream (a
// cross-rank hang with cudaFree, which waits for the whole device).
void* alloc(size_t bytes) {
  cudaStream_t s = ctx().stream;
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    (void)cudaGetLastError();
    throw std::runtime_error("strata::cuda::alloc: cudaMallocAsync(" + std::to_string(bytes) +
                             " bytes) failed: " + cudaGetErrorString(e) + " (" +
                             std::to_string(free_b >> 20) + " MiB free of " +
                             std::to_string(total_b >> 20) + " MiB)");
  }
  return p;
}

void release(void* p) {
  if (!p) return;
  STRATA_CUDA_CHECK(cudaFreeAsync(p, ctx().stream));
}

// Pageable src may be reused as soon as this returns (the runtime stages it); pinned src must
// stay unchanged until the stream has reached the copy.
void upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx().stream));
}

void download(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t s = ctx().stream;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx().stream));
}

// ---- Snapshots: device -> pinned host copies beside the compute stream ----------------------
// A memory checkpoint's copy of the parameters and optimizer state leaves the GPU on a stream
// of its own: the DMA overlaps the next step's kernels, the host never waits for it (the
// update waits on the device), and the destination is pinned (an asynchronous copy to
// pageable memory would be staged and synchronous).
namespace {
struct Snapshots {
  cudaStream_t stream = nullptr;
  cudaEvent_t after_compute = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};
};
Snapshots& snapshots() {
  static Snapshots s = [] {
    ctx();  // the device current on this thread
    Snapshots t;
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&t.after_compute, cudaEventDisableTiming));
    for (cudaEvent_t& e : t.done) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return t;
  }();
  return s;
}
}  // namespace

void* alloc_pinned(size_t bytes) {
  ctx();
  void* p = nullptr;
  STRATA_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 64));
  return p;
}

void free_pinned(void* p) {
  if (p) cudaFreeHost(p);  // at exit the context may be gone: nothing to report
}

void snapshot_copy(void* dst, const void* src, size_t bytes, int slot) {
  cudaStream_t compute = ctx().stream;
  Snapshots& s = snapshots();
  STRATA_CUDA_CHECK(cudaEventRecord(s.after_compute, compute));
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.after_compute, 0));
  if (bytes) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.stream));
  STRATA_CUDA_CHECK(cudaEventRecord(s.done[slot & 1], s.stream));
}

bool snapshot_ready(int slot) {
  ctx();  // this thread's current device: the events' (a copy thread calls this)
  const cudaError_t e = cudaEventQuery(snapshots().done[slot & 1]);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: nothing for a later check to report
    return false;
  }
  STRATA_CUDA_CHECK(e);
  return true;
}

void snapshot_device_wait(int slot) {
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(ctx().stream, snapshots().done[slot & 1], 0));
}

void zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx().stream));
}

namespace {
__global__ void add_inplace_kernel(float* dst, const float* src, int64_t n) {
  STRATA_GRID_STRIDE(i, n) dst[i] += src[i];
}
}  // namespace

// dst (n) += src (n)
void add_inplace(float* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  add_inplace_kernel<<<detail::blocks_for(n), detail::kThreads, 0, ctx().stream>>>(dst, src, n);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::cuda
