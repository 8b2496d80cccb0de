// bench_gemm's table of the MLP's and the CNN's fp32 products as strata's ops run them now
// (the small-row kernels of kernels/cpu/small_gemm.cpp at up to 64 rows on AVX-512), each
// with its epilogue and layout work counted (bias, ReLU, the forward's two transposes, the
// conv weight gradient's transpose of dy and, amortised over a batch of 64 samples, of the
// gradient itself), beside the oneDNN route the same op took before (matmul primitive or
// sgemm) in the same run. Results are checked against each other before any figure is printed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_gemm.h"
#include "strata/kernels_cpu.h"

namespace {

using strata::cpu::sgemm;
using strata::cpu::small_gemm;

struct Product {
  std::string what;
  double flops;                      // of one timed call
  std::function<void()> op, before;  // write `got` and `want`
  const std::vector<float>* got;
  const std::vector<float>* want;
  int per = 1;  // products per timed call (the batch's weight gradient: 64)
};

std::vector<float> uniform(size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

// Operands and outputs live as long as the table: the closures point into them.
struct Buffers {
  std::mt19937 gen{1};
  std::vector<std::vector<float>> kept;
  float* operand(size_t n) { return kept.emplace_back(uniform(n, gen)).data(); }
  std::vector<float>* output(size_t n) { return &kept.emplace_back(n, 0.f); }
};

// A linear layer's three products (B rows, I inputs, O outputs): the op against oneDNN's route
// before the small-row kernels (forward: the matmul primitive from 2^20 multiply-adds, else the
// bias copied in and sgemm; backward: sgemm).
void linear_products(std::vector<Product>& t, Buffers& m, const char* layer, int B, int I, int O,
                     bool relu, bool dx) {
  const float *x = m.operand(size_t(B) * I), *w = m.operand(size_t(O) * I),
              *bias = m.operand(O), *dy = m.operand(size_t(B) * O);
  auto *y1 = m.output(size_t(B) * O), *y2 = m.output(size_t(B) * O);
  const double fl = 2.0 * B * I * O;
  auto name = [&](const char* what) { return std::string(layer) + " " + what; };
  t.push_back({name("forward"), fl,
               [=] {
                 (relu ? strata::cpu::linear_relu_forward : strata::cpu::linear_forward)(
                     y1->data(), x, w, bias, B, I, O);
               },
               [=] {
                 if (int64_t(B) * O * I >= (int64_t(1) << 20)) {
                   strata::cpu::matmul(false, true, B, O, I, x, I, w, I, y2->data(), O, bias, relu);
                   return;
                 }
                 for (int b = 0; b < B; ++b) std::memcpy(y2->data() + b * O, bias, sizeof(float) * O);
                 sgemm(false, true, B, O, I, 1.f, x, I, w, I, 1.f, y2->data(), O);
                 if (relu) strata::cpu::relu_forward(y2->data(), y2->data(), int64_t(B) * O);
               },
               y1, y2});
  if (dx) {
    auto *d1 = m.output(size_t(B) * I), *d2 = m.output(size_t(B) * I);
    t.push_back({name("dX"), fl,
                 [=] { small_gemm(B, I, O, dy, O, 1, w, I, d1->data(), I, false); },
                 [=] { sgemm(false, false, B, I, O, 1.f, dy, O, w, I, 0.f, d2->data(), I); }, d1,
                 d2});
  }
  auto *g1 = m.output(size_t(O) * I), *g2 = m.output(size_t(O) * I);
  t.push_back({name("dW"), fl,
               [=] { small_gemm(O, I, B, dy, 1, O, x, I, g1->data(), I, false); },
               [=] { sgemm(true, false, O, I, B, 1.f, dy, O, x, I, 0.f, g2->data(), I); }, g1, g2});
}

// The CNN's conv2 (32 -> 64 channels, 3x3 "same" on 14 x 14) over a batch of 64 copies of one
// sample, timed per sample. Forward and weight gradient as the conv ops run them (the padded
// copy, the gathered GEMM and the transposes of kernels/cpu/conv_implicit.cpp all counted),
// against oneDNN's sgemm on the sample's im2col matrix, built beforehand: the GEMM alone, the
// im2col it needed not counted. The input gradient's product (dcols) as ChunkGemms runs it.
void conv_products(std::vector<Product>& t, Buffers& m) {
  constexpr int C = 32, H = 14, OC = 64, CK = C * 9, P = H * H, kBatch = 64;
  const strata::Conv2dShape s{kBatch, C, H, H, OC, 3, 3, 1, 1};
  const float *x1 = m.operand(size_t(C) * P), *w = m.operand(size_t(OC) * CK),
              *dy1 = m.operand(size_t(OC) * P), *bias = m.operand(OC);
  float *x = m.output(size_t(kBatch) * C * P)->data(), *dy = m.output(size_t(kBatch) * OC * P)->data();
  for (int b = 0; b < kBatch; ++b) {
    std::copy_n(x1, C * P, x + size_t(b) * C * P);
    std::copy_n(dy1, OC * P, dy + size_t(b) * OC * P);
  }
  float* cols = m.output(size_t(CK) * P)->data();  // im2col of the sample, pad 1
  for (int c = 0; c < C; ++c)
    for (int k = 0; k < 9; ++k)
      for (int h = 0; h < H; ++h)
        for (int v = 0; v < H; ++v) {
          const int ih = h + k / 3 - 1, iw = v + k % 3 - 1;
          cols[(c * 9 + k) * P + h * H + v] =
              ih < 0 || ih >= H || iw < 0 || iw >= H ? 0.f : x1[c * P + ih * H + iw];
        }
  float* scratch = m.output(size_t(strata::cpu::conv2d_scratch_size(s)))->data();
  const double fl = 2.0 * OC * CK * P * kBatch;
  auto *y1 = m.output(size_t(kBatch) * OC * P), *y2 = m.output(size_t(kBatch) * OC * P);
  t.push_back({"CNN conv2 fwd/sample", fl,
               [=] { strata::cpu::conv2d_forward(y1->data(), x, w, bias, s, scratch); },
               [=] {
                 for (int b = 0; b < kBatch; ++b) {
                   float* y = y2->data() + size_t(b) * OC * P;
                   for (int oc = 0; oc < OC; ++oc) std::fill(y + oc * P, y + (oc + 1) * P, bias[oc]);
                   sgemm(false, false, OC, P, CK, 1.f, w, CK, cols, P, 1.f, y, P);
                 }
               },
               y1, y2, kBatch});
  auto *g1 = m.output(size_t(OC) * CK), *g2 = m.output(size_t(OC) * CK);
  t.push_back({"CNN conv2 dW/sample", fl,
               [=] {
                 strata::cpu::conv2d_backward(nullptr, g1->data(), nullptr, dy, x, w, s, scratch,
                                              false);
               },
               [=] {
                 for (int b = 0; b < kBatch; ++b)
                   sgemm(false, true, OC, CK, P, 1.f, dy1, P, cols, P, b > 0 ? 1.f : 0.f,
                         g2->data(), CK);
               },
               g1, g2, kBatch});
  auto *c1 = m.output(size_t(CK) * P), *c2 = m.output(size_t(CK) * P);
  t.push_back({"CNN conv2 dcols/sample", fl / kBatch,
               [=] { small_gemm(CK, P, OC, w, 1, CK, dy1, P, c1->data(), P, false); },
               [=] { sgemm(true, false, CK, P, OC, 1.f, w, CK, dy1, P, 0.f, c2->data(), P); }, c1,
               c2});
}

}  // namespace

int bench_small_products(double peak, int calls) {
  if (!strata::cpu::small_gemm_supported()) {
    std::printf("\nfp32 products as the ops run them: not measured (no AVX-512F: the ops take "
                "oneDNN's sgemm and matmul, the table above)\n");
    return 0;
  }
  Buffers m;
  std::vector<Product> t;
  linear_products(t, m, "MLP fc1", 64, 784, 256, true, false);
  linear_products(t, m, "MLP fc2", 64, 256, 128, true, true);
  linear_products(t, m, "MLP fc3", 64, 128, 10, false, true);
  conv_products(t, m);
  linear_products(t, m, "CNN fc1", 64, 3136, 128, true, true);
  linear_products(t, m, "CNN fc2", 64, 128, 10, false, true);
  std::printf("\nfp32 products as the ops run them at up to 64 rows (small_gemm, all epilogues "
              "and transposes counted), against the oneDNN route they took before (conv2 fwd "
              "and dW: its sgemm alone, not the im2col it needed)\n"
              "%-24s %9s %9s %6s %10s %9s %6s %8s\n",
              "product", "op us", "GFLOP/s", "peak", "before us", "GFLOP/s", "peak", "speedup");
  for (const Product& p : t) {
    p.op();
    p.before();
    double err = 0, scale = 0;
    for (size_t i = 0; i < p.got->size(); ++i) {
      err = std::max(err, double(std::abs((*p.got)[i] - (*p.want)[i])));
      scale = std::max(scale, double(std::abs((*p.want)[i])));
    }
    if (!(err <= 1e-5 * scale)) {
      std::fprintf(stderr, "bench_gemm: %s: the op and oneDNN differ (%g of %g)\n",
                   p.what.c_str(), err, scale);
      return 1;
    }
    const double a = median_s(calls, p.op) / p.per, b = median_s(calls, p.before) / p.per;
    const double gf = p.flops / p.per * 1e-9;
    auto share = [&](double s) { return peak > 0 ? 100 * gf / s / peak : 0.0; };
    std::printf("%-24s %9.1f %9.0f %5.0f%% %10.1f %9.0f %5.0f%% %7.2fx\n", p.what.c_str(),
                a * 1e6, gf / a, share(a), b * 1e6, gf / b, share(b), b / a);
  }
  return 0;
}
