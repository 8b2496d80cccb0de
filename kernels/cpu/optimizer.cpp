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

// x[0, n) to out (unless out is x: in place), non-temporal with `stream`, its lane sums
// continued in `run` on the way (null: none).
__attribute__((target("avx512f"))) void emit_avx512(const float* x, float* out, int64_t n,
                                                   uint32_t* run, bool stream) {
  __m512i s1 = _mm512_setzero_si512(), s2 = s1;
  if (run) s1 = _mm512_loadu_si512(run), s2 = _mm512_loadu_si512(run + kSumLanes);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (out != x) {
      if (stream) _mm512_stream_ps(out + i, v);
      else _mm512_storeu_ps(out + i, v);
    }
    s1 = _mm512_add_epi32(s1, _mm512_castps_si512(v));
    s2 = _mm512_add_epi32(s2, s1);
  }
  if (stream) _mm_sfence();
  if (out != x) std::copy(x + i, x + n, out + i);
  if (!run) return;
  _mm512_storeu_si512(run, s1);
  _mm512_storeu_si512(run + kSumLanes, s2);
  if (i < n) lane_sums_run(x + i, n - i, run);
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

void adamw_update_to(const float* param, const float* grad, const float* m, const float* v,
                     float* param_out, float* m_out, float* v_out, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t t,
                     uint32_t* sums, bool stream) {
  const float decay = float(1.0 - double(lr) * weight_decay);
  const float w = float(1.0 - double(beta1));  // lerp weight
  const float one_minus_b2 = float(1.0 - double(beta2));
  const double bias_c1 = 1.0 - std::pow(double(beta1), double(t));
  const double bias_c2 = 1.0 - std::pow(double(beta2), double(t));
  const float neg_step = float(-(double(lr) / bias_c1));
  const float bias_c2_sqrt = float(std::sqrt(bias_c2));
  // Blocks of three passes so each pass is a plain vectorisable loop (see sqrt_inplace); the
  // block's lane sums while it is in cache (a whole number of the sums' blocks). Streamed, a
  // block is computed here and then stored past the cache.
#if defined(__x86_64__)
  stream = stream && have_avx512f() && aligned64(param_out) && aligned64(m_out) && aligned64(v_out);
  const bool emit = stream || (sums && have_avx512f());
#else
  stream = false;
#endif
  constexpr int kBlock = 256;
  static_assert(kBlock % kSumLanes == 0);
  alignas(64) float root[kBlock], local[3][kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int nb = int(std::min<int64_t>(kBlock, n - i0));
    const float *pi = param + i0, *mi = m + i0, *vi = v + i0, *g = grad + i0;
    float* out[3] = {param_out + i0, m_out + i0, v_out + i0};
    float *p = stream ? local[0] : out[0], *mb = stream ? local[1] : out[1],
          *vb = stream ? local[2] : out[2];
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
#if defined(__x86_64__)
    if (emit) {
      const float* done[3] = {p, mb, vb};
      for (int k = 0; k < 3; ++k)
        emit_avx512(done[k], out[k], nb, sums ? sums + k * kRunningWords : nullptr, stream);
      continue;
    }
#endif
    if (sums) {
      lane_sums_run(p, nb, sums);
      lane_sums_run(mb, nb, sums + kRunningWords);
      lane_sums_run(vb, nb, sums + 2 * kRunningWords);
    }
  }
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
