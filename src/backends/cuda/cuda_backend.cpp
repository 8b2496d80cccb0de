// The CUDA backend's table: kernels/cuda's ops, device memory, and the GPU this rank takes.
// Built into the module libstrata_cuda.so in builds with STRATA_CUDA (src/backends/nocuda otherwise).
#include <stdexcept>

#include "backends/cuda_api.h"
#include "op_profile.h"
#include "strata/error.h"
#include "strata/kernels_cuda.h"

namespace strata {
namespace {

void* device_alloc(size_t bytes) {
  if (bytes == 0) bytes = 64;
  void* p = cuda::alloc(bytes);
  cuda::zero(p, bytes);  // Memory's contract: zero-filled (stream-ordered before any use)
  return p;
}
void device_copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) cuda::copy(dst, src, bytes);
}
void device_upload(void* dst, const void* src, size_t bytes) {
  if (bytes) cuda::upload(dst, src, bytes);
}
void device_download(void* dst, const void* src, size_t bytes) {
  if (bytes) cuda::download(dst, src, bytes);
}

const Memory& device_memory() {
  static const Memory m{.name = "cuda", .host = false, .alloc = device_alloc,
                        .release = cuda::release, .zero = cuda::zero};
  return m;
}

}  // namespace

int cuda_devices(std::string* why) {
  std::string reason;
  const int n = cuda::device_count(&reason);
  if (why) *why = n > 0 ? "" : reason.empty() ? "no GPU visible to this process" : "no GPU visible (" + reason + ")";
  return n;
}

std::string cuda_device_name() { return cuda::initialized() ? cuda::device_name() : ""; }

namespace {

// The bf16 table's precision ops: the fp32 table's op (profiled or not) run with the GEMM
// precision set to bf16 for the call (kernels_cuda.h's Bf16Scope), so a table says its
// precision and both tables can be used in one process.
const Backend& fp32_table();
template <typename T, T M>
struct InBf16;
template <typename R, typename... A, R (*Backend::*M)(A...)>
struct InBf16<R (*Backend::*)(A...), M> {
  static R call(A... a) {
    cuda::Bf16Scope bf16(true);
    return (fp32_table().*M)(a...);
  }
};

const Backend& fp32_table() {
  static const Backend b = [] {
    // The whole batch per call on a GPU (processor gpu): one cuDNN call per conv.
    Backend t{.name = "cuda", .precision = Precision::fp32, .processor = Processor::gpu,
              .memory = &device_memory(), .upload = device_upload,
              .download = device_download, .copy = device_copy,
              .synchronize = cuda::synchronize};
    t.alloc_pinned = cuda::alloc_pinned;
    t.free_pinned = cuda::free_pinned;
    t.snapshot_copy = cuda::snapshot_copy;
    t.snapshot_ready = cuda::snapshot_ready;
    t.snapshot_device_wait = cuda::snapshot_device_wait;
#define STRATA_OP(name, ret, params) t.name = cuda::name;
#define STRATA_CPU_OP(name, ret, params)
#include "strata/ops.def"
    maybe_profile(t);
    return t;
  }();
  return b;
}

const Backend& bf16_table() {
  static const Backend b = [] {
    Backend t = fp32_table();
    t.precision = Precision::bf16;
#define STRATA_BF16_OP(name) t.name = &InBf16<decltype(&Backend::name), &Backend::name>::call;
    STRATA_PRECISION_OPS(STRATA_BF16_OP)
    // Its scratch holds the bf16 copies of a convolution's operands.
    STRATA_BF16_OP(conv2d_scratch_size)
#undef STRATA_BF16_OP
    return t;
  }();
  return b;
}

}  // namespace

const Backend& cuda_backend(int device, Precision precision) {
  try {
    cuda::init(device);
  } catch (const std::runtime_error& e) {
    throw UserError(kExitBadInput, fmt::format("--device cuda: cannot use GPU {}: {}", device, e.what()));
  }
  return precision == Precision::bf16 ? bf16_table() : fp32_table();
}

}  // namespace strata
