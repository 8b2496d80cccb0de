// The CUDA backend's table: kernels/cuda's ops, device memory, and the GPU this rank takes.
// Built into the module libstrata_cuda.so in builds with STRATA_CUDA (src/nocuda otherwise).
#include <stdexcept>

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
  static const Backend b{
      .name = "cuda",
      .memory = &device_memory(),
      .upload = device_upload,
      .download = device_download,
      .copy = device_copy,
      .synchronize = cuda::synchronize,
      .conv_pool_chunk_bytes = int64_t(1) << 40,  // the whole batch: one cuDNN call
      .add_inplace = cuda::add_inplace,
      .linear_forward = cuda::linear_forward,
      .linear_backward = cuda::linear_backward,
      .linear_relu_forward = cuda::linear_relu_forward,
      .linear_relu_backward = cuda::linear_relu_backward,
      .conv2d_scratch_size = cuda::conv2d_scratch_size,
      .conv2d_forward = cuda::conv2d_forward,
      .conv2d_backward = cuda::conv2d_backward,
      .maxpool2d_forward = cuda::maxpool2d_forward,
      .maxpool2d_backward = cuda::maxpool2d_backward,
      .relu_forward = cuda::relu_forward,
      .relu_backward = cuda::relu_backward,
      .gelu_forward = cuda::gelu_forward,
      .gelu_backward = cuda::gelu_backward,
      .dropout_forward = cuda::dropout_forward,
      .dropout_backward = cuda::dropout_backward,
      .softmax_xent_forward = cuda::softmax_xent_forward,
      .softmax_xent_backward = cuda::softmax_xent_backward,
      .count_correct = cuda::count_correct,
      .sgd_update = cuda::sgd_update,
      .adamw_update = cuda::adamw_update,
      .sum_squares = cuda::sum_squares,
      .scale_inplace = cuda::scale_inplace,
      .embedding_forward = cuda::embedding_forward,
      .embedding_backward = cuda::embedding_backward,
      .layernorm_forward = cuda::layernorm_forward,
      .layernorm_backward = cuda::layernorm_backward,
      .residual_forward = cuda::residual_forward,
      .attention_forward = cuda::attention_forward,
      .attention_backward = cuda::attention_backward,
  };
  return b;
}

}  // namespace strata
