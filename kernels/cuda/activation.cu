// Elementwise activations: one grid-stride kernel each, the CPU's formulas.
#include "common.cuh"

namespace strata::cuda {

using namespace detail;

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2*pi)

// x < 0 ? 0 : x keeps NaN, like PyTorch and the CPU kernel.
__global__ void relu_forward_kernel(float* out, const float* inp, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = x < 0.f ? 0.f : x;
  }
}

__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* out,
                                     int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float d = dout[i];
    dinp[i] = out[i] > 0.f ? d : 0.f;
  }
}

// gelu(x) = x/2 * (1 + erf(x/sqrt 2)), exact (PyTorch's approximate='none').
__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = x * 0.5f * (1.f + erff(x * kInvSqrt2));
  }
}

// gelu'(x) = Phi(x) + x * phi(x)
__global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* inp,
                                     int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    dinp[i] = dout[i] * (cdf + x * pdf);
  }
}

// GPT-2's tanh GELU: x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3) (PyTorch's
// approximate='tanh'); tanhf here, the CPU computes tanh from its exp: both within a few ulp.
constexpr float kSqrt2OverPi = 0.79788456080286536f, kCubic = 0.044715f;

__global__ void gelu_tanh_forward_kernel(float* out, const float* inp, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = x * 0.5f * (1.f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

// gelu'(x) = (1 + t)/2 + x/2 * (1 - t^2) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2)
__global__ void gelu_tanh_backward_kernel(float* dinp, const float* dout, const float* inp,
                                          int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i], x2 = x * x;
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x2 * x));
    const float du = kSqrt2OverPi * (1.f + 3.f * kCubic * x2);
    dinp[i] = dout[i] * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du);
  }
}

// silu(x) = x * s(x), s = 1 / (1 + e^-x), as on the CPU.
__global__ void silu_forward_kernel(float* out, const float* inp, int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = x / (1.f + expf(-x));
  }
}

// silu'(x) = s(x) * (1 + x * (1 - s(x)))
__global__ void silu_backward_kernel(float* dinp, const float* dout, const float* inp,
                                     int64_t n) {
  STRATA_GRID_STRIDE(i, n) {
    const float x = inp[i], s = 1.f / (1.f + expf(-x));
    dinp[i] = dout[i] * s * (1.f + x * (1.f - s));
  }
}

template <typename Kernel, typename... Args>
void launch_elementwise(Kernel kernel, int64_t n, Args... args) {
  if (n <= 0) return;
  kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(args..., n);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace

// inp (n) -> out (n); may run in place
void relu_forward(float* out, const float* inp, int64_t n) {
  launch_elementwise(relu_forward_kernel, n, out, inp);
}

// dout (n), out (n) -> dinp (n)
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  launch_elementwise(relu_backward_kernel, n, dinp, dout, out);
}

// inp (n) -> out (n)
void gelu_forward(float* out, const float* inp, int64_t n) {
  launch_elementwise(gelu_forward_kernel, n, out, inp);
}

// dout (n), inp (n) -> dinp (n)
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  launch_elementwise(gelu_backward_kernel, n, dinp, dout, inp);
}

// inp (n) -> out (n)
void gelu_tanh_forward(float* out, const float* inp, int64_t n) {
  launch_elementwise(gelu_tanh_forward_kernel, n, out, inp);
}

// dout (n), inp (n) -> dinp (n)
void gelu_tanh_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  launch_elementwise(gelu_tanh_backward_kernel, n, dinp, dout, inp);
}

// inp (n) -> out (n)
void silu_forward(float* out, const float* inp, int64_t n) {
  launch_elementwise(silu_forward_kernel, n, out, inp);
}

// dout (n), inp (n) -> dinp (n)
void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  launch_elementwise(silu_backward_kernel, n, dinp, dout, inp);
}

}  // namespace strata::cuda
