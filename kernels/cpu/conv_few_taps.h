// The two products of a convolution with few taps (CK = C*KH*KW <= 16: a first layer on
// one- or three-channel images) in fp32 on AVX-512, in place of sgemm, which runs them at a
// fifth to a third of the core's peak (a reduction of 9 is too short for its blocking; a
// weight gradient of 9 columns likewise). Same products, other summation order: see the .cpp.
#pragma once
#include <cstdint>

namespace strata::cpu {

// Whether the two below take a product of these sizes on this CPU (AVX-512, CK <= 16, OC a
// multiple of 8); else the caller uses sgemm.
bool few_taps_applies(int OC, int64_t CK);

// y (OC, n) = weight (OC, CK) @ cols (CK, n), added to y when `add`, else to the bias (OC)
// when there is one.
void few_taps_forward(float* y, const float* weight, const float* cols, int OC, int64_t n,
                      int64_t CK, const float* bias, bool add);

// dweight (OC, CK) = dy (OC, n) @ cols (CK, n)^T, added to dweight when `add`; and when dbias
// is given, dbias (OC) += each row of dy summed as sum_floats (conv.cpp) sums it, to the bit.
void few_taps_weight_grad(float* dweight, float* dbias, const float* dy, const float* cols, int OC,
                          int64_t n, int64_t CK, bool add);

}  // namespace strata::cpu
