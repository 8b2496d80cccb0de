// The CUDA backend's table: kernels/cuda's ops, device memory, and the GPU this rank takes.
// Built into the module libstrata_cuda.so in builds with STRATA_CUDA (src/nocuda otherwise).
#include <stdexcept>

#include "op_profile.h"
#include "strata/backend.h"
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

const Backend& cuda_backend(int device, bool bf16) {
  // Also when initialised before: init then only sets the precision (the table is shared, the
  // precision is the context's).
  try {
    cuda::init(device, bf16);
  } catch (const std::runtime_error& e) {
    throw UserError(kExitBadInput, fmt::format("--device cuda: cannot use GPU {}: {}", device, e.what()));
  }
  static const Backend b = [] {
    Backend t{.name = "cuda", .memory = &device_memory(), .upload = device_upload,
              .download = device_download, .copy = device_copy,
              .synchronize = cuda::synchronize,
              .conv_pool_chunk_bytes = int64_t(1) << 40};  // the whole batch: one cuDNN call
#define STRATA_OP(name, ret, params) t.name = cuda::name;
#define STRATA_CPU_OP(name, ret, params)
#include "strata/ops.def"
    maybe_profile(t);
    return t;
  }();
  return b;
}

}  // namespace strata
