// The CPU provider's start-up, shared with cpu-staged (whose ops are the CPU's).
#pragma once
#include "strata/backend.h"

namespace strata {

// Checks that this CPU computes in `precision` (bf16 needs native bf16 GEMMs: UserError, exit
// 2, naming train.precision otherwise) and starts the GEMM library on `threads` threads.
void start_cpu_math(int threads, Precision precision);

}  // namespace strata
