#include "strata/backend.h"

#include "strata/error.h"

namespace strata {

const Backend& cpu_backend() {
  static const Backend b{
      .name = "cpu",
      .linear_forward = cpu::linear_forward,
      .linear_backward = cpu::linear_backward,
      .linear_relu_forward = cpu::linear_relu_forward,
      .linear_relu_backward = cpu::linear_relu_backward,
      .conv2d_scratch_size = cpu::conv2d_scratch_size,
      .conv2d_forward = cpu::conv2d_forward,
      .conv2d_backward = cpu::conv2d_backward,
      .maxpool2d_forward = cpu::maxpool2d_forward,
      .maxpool2d_backward = cpu::maxpool2d_backward,
      .relu_forward = cpu::relu_forward,
      .relu_backward = cpu::relu_backward,
      .gelu_forward = cpu::gelu_forward,
      .gelu_backward = cpu::gelu_backward,
      .dropout_forward = cpu::dropout_forward,
      .dropout_backward = cpu::dropout_backward,
      .softmax_xent_forward = cpu::softmax_xent_forward,
      .softmax_xent_backward = cpu::softmax_xent_backward,
      .count_correct = cpu::count_correct,
      .sgd_update = cpu::sgd_update,
      .adamw_update = cpu::adamw_update,
      .sum_squares = cpu::sum_squares,
      .scale_inplace = cpu::scale_inplace,
  };
  return b;
}

const Backend& select_backend(const std::string& device, int threads, std::string* why) {
  if (device == "cuda")
    throw UserError(kExitBadInput,
                    "--device cuda: this build of strata has no CUDA backend (use cpu or auto)");
  if (device != "auto" && device != "cpu")
    fail_input("--device {}: expected auto, cpu or cuda", device);
  cpu::blas_init(threads);
  if (why)
    *why = fmt::format("cpu ({} thread{}, {} GEMM kernels)", threads, threads == 1 ? "" : "s",
                       cpu::blas_corename());
  return cpu_backend();
}

}  // namespace strata
