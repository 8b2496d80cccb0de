// Backend seam: the table of ops layers call, chosen at run time (--device auto|cpu|cuda).
// The CPU table points at kernels/cpu; a CUDA table with the same entries is the GPU issue's.
// Which backends exist is decided in CMake, not by #ifdefs through the code.
#pragma once
#include <cstdint>
#include <string>

#include "strata/kernels_cpu.h"

namespace strata {

struct Backend {
  const char* name;
  decltype(&cpu::linear_forward) linear_forward;
  decltype(&cpu::linear_backward) linear_backward;
  decltype(&cpu::linear_relu_forward) linear_relu_forward;  // linear then ReLU, fused
  decltype(&cpu::linear_relu_backward) linear_relu_backward;
  decltype(&cpu::conv2d_scratch_size) conv2d_scratch_size;
  decltype(&cpu::conv2d_forward) conv2d_forward;
  decltype(&cpu::conv2d_backward) conv2d_backward;
  decltype(&cpu::maxpool2d_forward) maxpool2d_forward;
  decltype(&cpu::maxpool2d_backward) maxpool2d_backward;
  decltype(&cpu::relu_forward) relu_forward;
  decltype(&cpu::relu_backward) relu_backward;
  decltype(&cpu::gelu_forward) gelu_forward;
  decltype(&cpu::gelu_backward) gelu_backward;
  decltype(&cpu::dropout_forward) dropout_forward;
  decltype(&cpu::dropout_backward) dropout_backward;
  decltype(&cpu::softmax_xent_forward) softmax_xent_forward;
  decltype(&cpu::softmax_xent_backward) softmax_xent_backward;
  decltype(&cpu::count_correct) count_correct;
  decltype(&cpu::sgd_update) sgd_update;
  decltype(&cpu::adamw_update) adamw_update;
  decltype(&cpu::sum_squares) sum_squares;
  decltype(&cpu::scale_inplace) scale_inplace;
};

const Backend& cpu_backend();

// Resolves "auto" | "cpu" | "cuda" to a backend; `threads` sets the CPU math threads.
// Throws UserError for a device this build or node cannot provide. `why` says what was chosen.
const Backend& select_backend(const std::string& device, int threads, std::string* why);

}  // namespace strata
