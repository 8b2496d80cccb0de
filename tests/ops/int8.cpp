// linear_int8_forward and conv2d_int8_forward (CPU only: int8 inference after strata quantize):
// the backend under test
// against the CPU's int8 op (exact: the same integer sums and one fp32 scaling per element),
// and the int8 result against the fp32 linear_forward of the unquantized weights:
//  - dynamic (per-row) activation scales, max_rel 2e-2: weights and inputs rounded to 8 bits
//    (half a step of max|row| / 127 each, ~0.4 % of the row's largest value), the errors of I
//    products partly cancelling; measured 4.6e-3..6.8e-3 on these shapes (clipping: 0.31-0.41);
//    the convolution, its receptive fields quantized per output position: 4.6e-3..5.8e-3.
//  - a static scale (calibrated on this very input, so no value clips) within the same bound;
//    a static scale half the input's range clips and must show it (max_rel above 0.1).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness.h"
#include "strata/kernels_cpu.h"
#include "table.h"

namespace strata::optest {
namespace {

struct Shape3 {
  int B, I, O;
};
const Shape3 kShapes[] = {{64, 300, 70}, {1, 784, 256}, {33, 17, 5}, {128, 384, 1152}};

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  Quantized(const std::vector<float>& w, int O, int I)
      : q(size_t(O) * I), scale(size_t(O)), sum(size_t(O)) {
    cpu::quantize_rows(q.data(), scale.data(), sum.data(), w.data(), O, I);
  }
  Int8Matrix matrix(float act_scale) const {
    return {.q = q.data(), .scale = scale.data(), .col_sum = sum.data(), .act_scale = act_scale};
  }
};

double max_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e = std::max(e, double(std::abs(got[i] - ref[i])));
    m = std::max(m, double(std::abs(ref[i])));
  }
  return m > 0 ? e / m : e;
}

}  // namespace

void check_linear_int8_forward() {
  for (const Shape3& s : kShapes) {
    const auto x = random_vector(1, size_t(s.B) * s.I), w = random_vector(2, size_t(s.O) * s.I),
               bias = random_vector(3, size_t(s.O));
    const Quantized qw(w, s.O, s.I);
    float xmax = 0;
    for (float v : x) xmax = std::max(xmax, std::abs(v));
    // act_scale: 0 (per row), calibrated on x, and half of that (clipping).
    for (const float act : {0.f, xmax / 127.f, xmax / 254.f})
      for (bool relu : {false, true}) {
        OpCase c(fmt::format("linear_int8_forward B{} I{} O{} {}{}", s.B, s.I, s.O,
                             act == 0 ? "per-row" : act == xmax / 127.f ? "static" : "clipping",
                             relu ? " relu" : ""));
        const F32 in = c.in(x), b = c.in(bias);
        const F32 out = c.out("out", size_t(s.B) * s.O, Tol::exact());
        c.run([&](const Backend& be, const Ptrs& p) {
          be.linear_int8_forward(p[out], p[in], qw.matrix(act), p[b], s.B, s.I, s.O, relu);
        });
        std::vector<float> ref(size_t(s.B) * s.O);
        (relu ? cpu::linear_relu_forward : cpu::linear_forward)(ref.data(), x.data(), w.data(),
                                                                bias.data(), s.B, s.I, s.O);
        const double e = max_rel(c.got(out), ref);
        fmt::print("  int8 against the fp32 op: max_rel {:.2e}\n", e);
        INFO("int8 against fp32, max_rel " << e);
        if (act == xmax / 254.f)
          CHECK(e > 0.1);
        else
          CHECK(e < 2e-2);
      }
  }
}

void check_conv2d_int8_forward() {
  const Conv2dShape shapes[] = {
      {.B = 4, .C = 3, .H = 17, .W = 17, .OC = 8, .KH = 3, .KW = 3, .stride = 1, .pad = 1},
      {.B = 3, .C = 32, .H = 14, .W = 14, .OC = 64, .KH = 3, .KW = 3, .stride = 1, .pad = 1},
      {.B = 2, .C = 16, .H = 9, .W = 11, .OC = 5, .KH = 5, .KW = 3, .stride = 2, .pad = 2}};
  for (const Conv2dShape& s : shapes) {
    const int64_t CK = int64_t(s.C) * s.KH * s.KW, nout = int64_t(s.B) * s.OC * s.OH() * s.OW();
    const auto x = random_vector(1, size_t(s.B) * s.C * s.H * s.W),
               w = random_vector(2, size_t(s.OC * CK)), bias = random_vector(3, size_t(s.OC));
    const Quantized qw(w, s.OC, int(CK));
    for (const float act : {0.f, 1.f / 127.f}) {  // per position; static (inputs in [-1, 1])
      OpCase c(fmt::format("conv2d_int8_forward {}x{}x{}x{} oc{} k{}x{} s{} p{} {}", s.B, s.C, s.H,
                           s.W, s.OC, s.KH, s.KW, s.stride, s.pad, act == 0 ? "per-position" : "static"));
      const F32 in = c.in(x), b = c.in(bias);
      const F32 scratch = c.scratch([&](const Backend& be) { return be.conv2d_scratch_size(s); });
      const F32 out = c.out("out", size_t(nout), Tol::exact());
      c.run([&](const Backend& be, const Ptrs& p) {
        be.conv2d_int8_forward(p[out], p[in], qw.matrix(act), p[b], s, p[scratch]);
      });
      std::vector<float> ref(static_cast<size_t>(nout));
      std::vector<float> work(static_cast<size_t>(cpu::conv2d_scratch_size(s)));
      cpu::conv2d_forward(ref.data(), x.data(), w.data(), bias.data(), s, work.data());
      const double e = max_rel(c.got(out), ref);
      fmt::print("  int8 against the fp32 op: max_rel {:.2e}\n", e);
      INFO("int8 against fp32, max_rel " << e);
      CHECK(e < 2e-2);
    }
  }
}

}  // namespace strata::optest
