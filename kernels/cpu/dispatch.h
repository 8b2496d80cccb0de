// Kernels written once over GCC vector types of W floats and compiled once per instruction
// set, the build this CPU can run picked once at run time (attention.cpp, layernorm.cpp,
// activation.cpp); and the per-thread scratch their callers keep between calls.
#pragma once
#include <cstddef>
#include <vector>

namespace strata::cpu {

#if defined(__x86_64__)
#define STRATA_ISA_TARGET(t) __attribute__((target(t)))
#else
#define STRATA_ISA_TARGET(t)
#endif

// Defines a kernel's three builds with VARIANT(suffix, attributes, W): `generic` for baseline
// x86-64 (W = 4: SSE), `avx512` (W = 16) and `avx2` (W = 8, compiled for `avx2_target`, e.g.
// "avx2" or "avx2,fma"). Each is the native width: GCC keeps a wider vector type in memory,
// which measured slower. Off x86 all three are plain builds.
#define STRATA_ISA_VARIANTS(VARIANT, avx2_target)         \
  VARIANT(generic, , 4)                                   \
  VARIANT(avx512, STRATA_ISA_TARGET("avx512f"), 16)       \
  VARIANT(avx2, STRATA_ISA_TARGET(avx2_target), 8)

// The widest build the CPU supports (the AVX2 one also needs FMA when `avx2_needs_fma`).
template <class F>
F pick_isa(F avx512, F avx2, F generic, bool avx2_needs_fma = false) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return avx512;
  if (__builtin_cpu_supports("avx2") && (!avx2_needs_fma || __builtin_cpu_supports("fma")))
    return avx2;
#else
  (void)avx512;
  (void)avx2;
  (void)avx2_needs_fma;
#endif
  return generic;
}

// At least n floats of scratch for the calling thread, kept (and grown) between calls; one
// buffer per thread, shared by the kernels that use it (none holds it across another's call).
inline float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace strata::cpu
