// The backend ops as values: `Op` names each entry of strata/ops.def (the one list of ops and
// their contracts), for Backend::supports and for messages and tests that go over every op.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace strata {

// A 2-D convolution's shape, shared by every backend's conv ops.
struct Conv2dShape {
  int B, C, H, W;      // input
  int OC, KH, KW;      // weight is (OC, C, KH, KW)
  int stride, pad;     // same in both spatial dims
  int OH() const { return (H + 2 * pad - KH) / stride + 1; }
  int OW() const { return (W + 2 * pad - KW) / stride + 1; }
};

// An int8 weight matrix (O, I) for inference (strata quantize): q[o][i] = round(w[o][i] /
// scale[o]) in [-127, 127], symmetric per output channel; col_sum[o] = sum_i q[o][i] (the
// kernels feed activations as unsigned bytes, x + 128, and subtract 128 * col_sum). act_scale
// > 0: a static activation scale from calibration; 0: each input row's own max|x| / 127.
struct Int8Matrix {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int32_t* col_sum = nullptr;
  float act_scale = 0;
};

// Pieces of a flat buffer that hold, in order, one contiguous range of the packed layout (the
// model's tensors back to back; the flat buffers pad each to 256 bytes): (offset, count)
// each, offsets increasing. The floats between two pieces are zero (the padding), so a
// backend may sum over them.
using FlatPieces = std::vector<std::pair<int64_t, int64_t>>;

enum class Op {
#define STRATA_OP(name, ret, params) name,
#include "strata/ops.def"
};
inline constexpr int kNumOps = 0
#define STRATA_OP(name, ret, params) + 1
#include "strata/ops.def"
    ;

// "linear_forward", ...
const char* op_name(Op op);

// The ops whose products a backend's precision changes (its GEMMs and convolutions): a bf16
// table differs from its fp32 one in these only. Softmax, norms and every sum stay fp32.
#define STRATA_PRECISION_OPS(X)                                                              \
  X(linear_forward) X(linear_backward) X(linear_relu_forward) X(linear_relu_backward)        \
  X(conv2d_forward) X(conv2d_backward) X(attention_forward) X(attention_backward)
// ... and, of the CPU-only ops, the linear layer's backward through a kept GELU derivative.
#define STRATA_CPU_PRECISION_OPS(X) X(linear_gelu_backward)

}  // namespace strata
