// W lanes of float (and of int32) as GCC vector types, and the lane operations the CPU
// kernels written over them share (attention.cpp, layernorm.cpp, activation.cpp). The kernels
// are compiled once per W, each build for its instruction set (dispatch.h); these helpers are
// always inlined into that build.
#pragma once
#include <cstdint>
#include <cstring>

// The helpers pass vectors by value; they are always inlined into a function compiled for the
// matching target, so the ABI note GCC gives about them never applies (for the including file).
#pragma GCC diagnostic ignored "-Wpsabi"

#define STRATA_INLINE inline __attribute__((always_inline))

namespace strata::cpu::simd {

// W lanes of float (F) and of int32 (I).
typedef float F2 __attribute__((vector_size(8)));
typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I2 __attribute__((vector_size(8)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef int32_t I16 __attribute__((vector_size(64)));
template <int W> struct VecTypes;
template <> struct VecTypes<2> { using F = F2; using I = I2; };
template <> struct VecTypes<4> { using F = F4; using I = I4; };
template <> struct VecTypes<8> { using F = F8; using I = I8; };
template <> struct VecTypes<16> { using F = F16; using I = I16; };

template <int W>
struct Lanes {
  using F = typename VecTypes<W>::F;
  using I = typename VecTypes<W>::I;

  static STRATA_INLINE F load(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static STRATA_INLINE void store(float* p, const F& v) { std::memcpy(p, &v, sizeof v); }
  static STRATA_INLINE F splat(float x) { return F{} + x; }
  static STRATA_INLINE I index() {
    I i{};
    for (int l = 0; l < W; ++l) i[l] = l;
    return i;
  }
  static STRATA_INLINE F max(const F& a, const F& b) { return a > b ? a : b; }

  // The last, partial vector of a row: the n < W floats at p, the other lanes `fill`. When the
  // buffer has room for a whole vector there (room >= W: an att row holds T floats, a causal
  // row uses t+1) it is one load and a lane select (the extra lanes are read, never used);
  // else it goes through a stack buffer.
  static STRATA_INLINE F load_tail(const float* p, int n, int room, float fill) {
    if (room >= W) return index() < n ? load(p) : splat(fill);
    float buf[W];
    for (int l = 0; l < W; ++l) buf[l] = l < n ? p[l] : fill;
    return load(buf);
  }
  // Stores the first n lanes of v at p; all W when room >= W (the caller has given the extra
  // lanes the values that belong there).
  static STRATA_INLINE void store_tail(float* p, const F& v, int n, int room) {
    if (room >= W) return store(p, v);
    float buf[W];
    store(buf, v);
    for (int l = 0; l < n; ++l) p[l] = buf[l];
  }

  // Sum and maximum of the lanes as a fixed tree: the two halves added lane by lane, and so on.
  static STRATA_INLINE float hsum(const F& v) {
    if constexpr (W == 2) {
      return v[0] + v[1];
    } else {
      typename Lanes<W / 2>::F lo, hi;
      std::memcpy(&lo, &v, sizeof lo);
      std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
      return Lanes<W / 2>::hsum(lo + hi);
    }
  }
  static STRATA_INLINE float hmax(const F& v) {
    if constexpr (W == 2) {
      return v[1] > v[0] ? v[1] : v[0];
    } else {
      typename Lanes<W / 2>::F lo, hi;
      std::memcpy(&lo, &v, sizeof lo);
      std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
      return Lanes<W / 2>::hmax(Lanes<W / 2>::max(lo, hi));
    }
  }

  // exp(x) for the x <= 0 of a softmax shifted by its maximum (Cephes expf: round x/ln2 to n,
  // two-constant Cody-Waite reduction, degree-6 polynomial on |r| <= ln2/2, times 2^n by the
  // exponent bits; within 2 ulp of the true value). Below -87.3 the result is 0 (the true
  // value is under 1.2e-38, subnormal); -inf gives 0, NaN gives NaN.
  static STRATA_INLINE F exp_nonpos(const F& x) {
    const F lo = splat(-87.33654f);
    const auto under = x < lo;
    const F xc = under ? lo : x;
    const F magic = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
    F n = xc * 1.44269504088896341f + magic;
    n = n - magic;
    F r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    F p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const F y = p * r * r + r + 1.f;
    const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n, n in [-126, 0]
    const F e = y * (F)bits;  // same-size vector cast: the bits as floats
    return under ? F{} : e;
  }
};

}  // namespace strata::cpu::simd
