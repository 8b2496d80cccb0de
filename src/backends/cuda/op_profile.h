// The CUDA table's optional op profile (STRATA_CUDA_PROFILE=1; op_profile.cpp).
#pragma once
#include "strata/backend.h"

namespace strata {

// Replaces each op of `t` by one that times it, when STRATA_CUDA_PROFILE=1.
void maybe_profile(Backend& t);

}  // namespace strata
