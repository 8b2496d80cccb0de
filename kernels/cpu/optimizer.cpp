// Optimizer steps with torch.optim's update formulas and operation order: scalars (lr, bias
// corrections) are computed in double as Python does, the elementwise work in float as
// PyTorch's fp32 kernels do, so a run can be compared with PyTorch closely.
#include <algorithm>
#include <cmath>
#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "strata/kernels_cpu.h"
#include "strata/lane_sums.h"

namespace strata::cpu {

// param, grad, momentum_buf (n). torch.optim.SGD with dampening 0:
//   g = grad + wd*p;  buf = first ? g : momentum*buf + g;
//   p -= lr * (nesterov ? g + momentum*buf : buf)
// With momentum == 0 the buffer is neither read nor written (it may be null).
namespace {

#if defined(__x86_64__)
// The momentum case (the common one), 16 floats at a time: the same operations in the same
// order as the scalar loop below, so the results are bitwise those of the scalar loop whatever
// the alignment of a range. Mul and add must never be fused: AVX-512F has FMA instructions, and
// GCC's default -ffp-contract=fast fused some of them (body and tail then rounded differently,
// so updating per layer in backward differed from one update after it); hence fp-contract=off.
// SSE2 code did 4 per iteration and was about 11% of an MLP training step. With `sums`, the
// new values' lane sums (strata/lane_sums.h) are added in registers, as they are stored.
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void sgd_momentum_avx512(
    const float* param, const float* grad, const float* buf, float* param_out, float* buf_out,
    int64_t n, float neg_lr, float momentum, float wd, bool nesterov, bool first_step,
    uint32_t* sums, bool stream) {
  const __m512 vlr = _mm512_set1_ps(neg_lr), vm = _mm512_set1_ps(momentum),
               vwd = _mm512_set1_ps(wd);
  // The running sums go on from sums' (lane_sums.h: s2 adds s1 after every block).
  __m512i p1 = _mm512_setzero_si512(), p2 = p1, b1 = p1, b2 = p1;
  if (sums) {
    p1 = _mm512_loadu_si512(sums), p2 = _mm512_loadu_si512(sums + kSumLanes);
    b1 = _mm512_loadu_si512(sums + kRunningWords);
    b2 = _mm512_loadu_si512(sums + kRunningWords + kSumLanes);
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 p = _mm512_loadu_ps(param + i);
    const __m512 g = _mm512_add_ps(_mm512_loadu_ps(grad + i), _mm512_mul_ps(vwd, p));
    const __m512 b =
        first_step ? g : _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(buf + i), vm), g);
    const __m512 step = nesterov ? _mm512_add_ps(g, _mm512_mul_ps(vm, b)) : b;
    const __m512 np = _mm512_add_ps(p, _mm512_mul_ps(vlr, step));
    if (stream) {
      _mm512_stream_ps(buf_out + i, b);
      _mm512_stream_ps(param_out + i, np);
    } else {
      _mm512_storeu_ps(buf_out + i, b);
      _mm512_storeu_ps(param_out + i, np);
    }
    if (sums) {
      p1 = _mm512_add_epi32(p1, _mm512_castps_si512(np));
      p2 = _mm512_add_epi32(p2, p1);
      b1 = _mm512_add_epi32(b1, _mm512_castps_si512(b));
      b2 = _mm512_add_epi32(b2, b1);
    }
  }
  if (sums) {
    const __m512i run[4] = {p1, p2, b1, b2};
    for (int k = 0; k < 4; ++k) _mm512_storeu_si512(sums + k * kSumLanes, run[k]);
  }
  if (stream) _mm_sfence();
  const int64_t body = i;
  for (; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    const float b = first_step ? g : buf[i] * momentum + g;
    buf_out[i] = b;
    param_out[i] = param[i] + neg_lr * (nesterov ? g + momentum * b : b);
  }
  if (sums && body < n) {  // the last, partial block
    lane_sums_run(param_out + body, n - body, sums);
    lane_sums_run(buf_out + body, n - body, sums + kRunningWords);
  }
}

bool have_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// Streaming stores need 64-byte aligned outputs (the flat buffers' are 256-byte aligned).
bool aligned64(const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }
#endif

}  // namespace

void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step) {
  sgd_update_to(param, grad, momentum_buf, param, momentum_buf, n, lr, momentum, weight_decay,
                nesterov, first_step, nullptr, false);
}

void sgd_update_to(const float* param, const float* grad, const float* momentum_buf,
                   float* param_out, float* momentum_out, int64_t n, float lr, float momentum,
                   float weight_decay, bool nesterov, bool first_step, uint32_t* sums,
                   bool stream) {
  const float neg_lr = -lr;
#if defined(__x86_64__)
  if (momentum != 0.f && momentum_out && have_avx512f()) {
    stream = stream && aligned64(param_out) && aligned64(momentum_out);
    sgd_momentum_avx512(param, grad, momentum_buf, param_out, momentum_out, n, neg_lr, momentum,
                        weight_decay, nesterov, first_step, sums, stream);
    return;
  }
#endif
  if (momentum == 0.f || !momentum_out) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      param_out[i] = param[i] + neg_lr * g;
    }
    if (sums) lane_sums_run(param_out, n, sums);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    const float buf = first_step ? g : momentum_buf[i] * momentum + g;
    momentum_out[i] = buf;
    param_out[i] = param[i] + neg_lr * (nesterov ? g + momentum * buf : buf);
  }
  if (sums) {
    lane_sums_run(param_out, n, sums);
    lane_sums_run(momentum_out, n, sums + kRunningWords);
  }
}

namespace {

// x = sqrt(x) elementwise. Without -fno-math-errno GCC cannot vectorise std::sqrt (it keeps a
// libm call to set errno for negative inputs), which made adamw_update 5.7x slower (2.4 ms vs
// 0.43 ms for 420k parameters); sqrtps is part of baseline x86-64 (SSE2).
void sqrt_inplace(float* x, int n) {
  int i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

}  // namespace

// param, grad, m, v (n); t is the 1-based step. torch.optim.AdamW:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1-b1);  v = b2*v + (1-b2)*g*g;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  adamw_update_to(param, grad, m, v, param, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                  nullptr, false);
}

namespace {

// AdamW's per-element constants, from its hyperparameters and step t (in double, as Python).
struct AdamwScalars {
  float decay, w, beta2, one_minus_b2, neg_step, bias_c2_sqrt, eps;
  AdamwScalars(float lr, float beta1, float beta2_, float eps_, float weight_decay, int64_t t)
      : decay(float(1.0 - double(lr) * weight_decay)),
        w(float(1.0 - double(beta1))),  // lerp weight
        beta2(beta2_),
        one_minus_b2(float(1.0 - double(beta2_))),
        neg_step(float(-(double(lr) / (1.0 - std::pow(double(beta1), double(t)))))),
        bias_c2_sqrt(float(std::sqrt(1.0 - std::pow(double(beta2_), double(t))))),
        eps(eps_) {}
};

// The update in blocks of three passes, each a plain loop the compiler vectorises (see
// sqrt_inplace), where adamw_avx512 does not apply, and for its tail; the block's lane sums
// while it is in cache (a whole number of the sums' blocks).
void adamw_blocks(const float* param, const float* grad, const float* m, const float* v,
                  float* param_out, float* m_out, float* v_out, int64_t n, const AdamwScalars& k,
                  uint32_t* sums) {
  const float decay = k.decay, w = k.w, beta2 = k.beta2, one_minus_b2 = k.one_minus_b2,
              neg_step = k.neg_step, bias_c2_sqrt = k.bias_c2_sqrt, eps = k.eps;
  constexpr int kBlock = 256;
  static_assert(kBlock % kSumLanes == 0);
  alignas(64) float root[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int nb = int(std::min<int64_t>(kBlock, n - i0));
    const float *pi = param + i0, *mi = m + i0, *vi = v + i0, *g = grad + i0;
    float *p = param_out + i0, *mb = m_out + i0, *vb = v_out + i0;
    for (int i = 0; i < nb; ++i) {
      p[i] = pi[i] * decay;
      // torch.lerp's formula: exact at both ends of the weight range.
      mb[i] = w < 0.5f ? mi[i] + w * (g[i] - mi[i]) : g[i] - (g[i] - mi[i]) * (1.f - w);
      vb[i] = vi[i] * beta2 + one_minus_b2 * g[i] * g[i];
      root[i] = vb[i];
    }
    sqrt_inplace(root, nb);
    for (int i = 0; i < nb; ++i) {
      const float denom = root[i] / bias_c2_sqrt + eps;
      p[i] += neg_step * mb[i] / denom;  // addcdiv: p + (value * m) / denom
    }
    if (sums) {
      lane_sums_run(p, nb, sums);
      lane_sums_run(mb, nb, sums + kRunningWords);
      lane_sums_run(vb, nb, sums + 2 * kRunningWords);
    }
  }
}

#if defined(__x86_64__)
// The whole update on 16 floats at a time, in one pass: the operations of adamw_blocks' loops
// in the same order (mul and add never fused, as sgd_momentum_avx512; sqrt and division
// are exact in any width), so the bits are theirs. Built for baseline x86-64 those loops ran
// 4 wide, with 4-wide divisions and square roots: the update took 1.4 ns a parameter on Zen 5,
// 3.6 % of the GPT's bf16 step. Outputs may be the inputs (in place) or the gradient (v_out).
template <bool LerpFromM>
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void adamw_avx512(
    const float* param, const float* grad, const float* m, const float* v, float* param_out,
    float* m_out, float* v_out, int64_t n, const AdamwScalars& k, uint32_t* sums, bool stream) {
  const __m512 decay = _mm512_set1_ps(k.decay), w = _mm512_set1_ps(k.w),
               one_minus_w = _mm512_set1_ps(1.f - k.w), b2 = _mm512_set1_ps(k.beta2),
               omb2 = _mm512_set1_ps(k.one_minus_b2), neg_step = _mm512_set1_ps(k.neg_step),
               bc2 = _mm512_set1_ps(k.bias_c2_sqrt), eps = _mm512_set1_ps(k.eps);
  __m512i s[6];  // s1 then s2 of p, m, v (lane_sums.h)
  for (int j = 0; j < 6; ++j)
    s[j] = sums ? _mm512_loadu_si512(sums + (j / 2) * kRunningWords + (j % 2) * kSumLanes)
                : _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(grad + i), mi = _mm512_loadu_ps(m + i);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(param + i), decay);
    const __m512 diff = _mm512_sub_ps(g, mi);
    const __m512 mb = LerpFromM ? _mm512_add_ps(mi, _mm512_mul_ps(w, diff))
                                : _mm512_sub_ps(g, _mm512_mul_ps(diff, one_minus_w));
    const __m512 vb = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    // (maskz: GCC 12's _mm512_sqrt_ps passes an undefined vector that -Wmaybe-uninitialized flags)
    const __m512 root = _mm512_maskz_sqrt_ps(__mmask16(0xffff), vb);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(root, bc2), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step, mb), denom));
    const __m512 out[3] = {p, mb, vb};
    float* dst[3] = {param_out + i, m_out + i, v_out + i};
    for (int j = 0; j < 3; ++j) {
      if (stream) _mm512_stream_ps(dst[j], out[j]);
      else _mm512_storeu_ps(dst[j], out[j]);
      if (sums) {
        s[2 * j] = _mm512_add_epi32(s[2 * j], _mm512_castps_si512(out[j]));
        s[2 * j + 1] = _mm512_add_epi32(s[2 * j + 1], s[2 * j]);
      }
    }
  }
  if (stream) _mm_sfence();
  if (sums)
    for (int j = 0; j < 6; ++j)
      _mm512_storeu_si512(sums + (j / 2) * kRunningWords + (j % 2) * kSumLanes, s[j]);
  if (i < n)  // the tail: the scalar form (and its lane sums)
    adamw_blocks(param + i, grad + i, m + i, v + i, param_out + i, m_out + i, v_out + i, n - i, k,
                 sums);
}
#endif

}  // namespace

void adamw_update_to(const float* param, const float* grad, const float* m, const float* v,
                     float* param_out, float* m_out, float* v_out, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t t,
                     uint32_t* sums, bool stream) {
  const AdamwScalars k(lr, beta1, beta2, eps, weight_decay, t);
#if defined(__x86_64__)
  if (have_avx512f()) {
    stream = stream && aligned64(param_out) && aligned64(m_out) && aligned64(v_out);
    if (k.w < 0.5f)
      adamw_avx512<true>(param, grad, m, v, param_out, m_out, v_out, n, k, sums, stream);
    else
      adamw_avx512<false>(param, grad, m, v, param_out, m_out, v_out, n, k, sums, stream);
    return;
  }
#endif
  (void)stream;  // (past the cache only on AVX-512)
  adamw_blocks(param, grad, m, v, param_out, m_out, v_out, n, k, sums);
}

// The pieces of x -> sum of squares in double, as if the pieces were one array y of n floats:
// eight partial sums, y[k] into lane k % 8 (the loop vectorises; no -ffast-math) for k below
// the last multiple of 8, the tail into lane 0; then the lanes in order. The pieces' offsets
// in x do not change a lane: the sum is that of the packed layout, however x is padded.
double sum_squares(const float* x, const FlatPieces& pieces) {
  int64_t n = 0;
  for (const auto& [at, count] : pieces) n += count;
  const int64_t body = n / 8 * 8;  // y[0, body) in 8 lanes, y[body, n) in lane 0
  double acc[8] = {};
  int64_t k = 0;  // index in y
  for (const auto& [at, count] : pieces) {
    const float* p = x + at;
    int64_t i = 0;
    for (; i < count && k % 8 != 0 && k < body; ++i, ++k) acc[k % 8] += double(p[i]) * p[i];
    for (; i + 8 <= count && k + 8 <= body; i += 8, k += 8)
      for (int l = 0; l < 8; ++l) acc[l] += double(p[i + l]) * p[i + l];
    for (; i < count; ++i, ++k) acc[k < body ? k % 8 : 0] += double(p[i]) * p[i];
  }
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
}

// x (n) *= s
void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_inplace(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace strata::cpu
