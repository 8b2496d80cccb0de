// The backend ops as values: `Op` names each entry of strata/ops.def (the one list of ops and
// their contracts), for Backend::supports and for messages and tests that go over every op.
#pragma once
#include <cstdint>

namespace strata {

// A 2-D convolution's shape, shared by every backend's conv ops.
struct Conv2dShape {
  int B, C, H, W;      // input
  int OC, KH, KW;      // weight is (OC, C, KH, KW)
  int stride, pad;     // same in both spatial dims
  int OH() const { return (H + 2 * pad - KH) / stride + 1; }
  int OW() const { return (W + 2 * pad - KW) / stride + 1; }
};

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

}  // namespace strata
