// The op table: for every op of strata/ops.def a check_<op>() that runs it on the backend
// under test against the CPU reference over its shapes and precisions, and for every backward
// op an fd_<op>() that checks the CPU reference against central differences of its forward.
// table.cpp makes a Catch2 test of each; an op added to ops.def without its check_<op> fails
// to link, and one named *_backward without an fd_<op> fails the [table] test.
#pragma once

namespace strata::optest {

#define STRATA_OP(name, ret, params) void check_##name();
#include "strata/ops.def"

// The backward ops, each with its finite-difference check (in the op's family file).
// clang-format off
#define STRATA_FD_OPS(X)                                                                     \
  X(relu_backward) X(gelu_backward) X(gelu_tanh_backward) X(silu_backward) X(linear_backward) X(linear_relu_backward) X(linear_gelu_backward)              \
  X(conv2d_backward) X(maxpool2d_backward) X(dropout_backward) X(softmax_xent_backward)     \
  X(embedding_backward) X(layernorm_backward) X(attention_backward)
// clang-format on

#define STRATA_FD_DECLARE(name) void fd_##name();
STRATA_FD_OPS(STRATA_FD_DECLARE)
#undef STRATA_FD_DECLARE

}  // namespace strata::optest
