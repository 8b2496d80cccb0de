// GFLOP/s of the CPU kernels on the benchmark models' layers (batch 64, one thread):
// the MLP 784-256-128-10, the CNN's two 3x3 convolutions and its 2x2 max pooling. Each figure is the best of N runs
// of thread CPU time, which is robust to other processes on a shared machine.
//   usage: bench_kernels [runs (default 20)]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/rng.h"
#include "thread_timing.h"

using namespace strata;
using namespace strata::cpu;

namespace {

int g_runs = 20;

template <class F>
double best_ms(F f) {
  return bench::best_ms(g_runs, f);
}

std::vector<float> random_vec(Rng& rng, int64_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(-1.f, 1.f);
  return v;
}

void report(const char* what, double flop, double ms) {
  std::printf("  %-34s %8.3f ms %7.1f GFLOP/s\n", what, ms, flop / ms * 1e-6);
}

void bench_sgemm(int n) {
  Rng rng(1);
  const auto a = random_vec(rng, int64_t(n) * n), b = random_vec(rng, int64_t(n) * n);
  std::vector<float> c(int64_t(n) * n);
  const double ms = best_ms([&] {
    sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  });
  std::printf("sgemm\n");
  char what[64];
  std::snprintf(what, sizeof what, "%d x %d x %d", n, n, n);
  report(what, 2.0 * n * n * n, ms);
}

void bench_linear(int B, int I, int O) {
  Rng rng(2);
  const auto x = random_vec(rng, int64_t(B) * I), w = random_vec(rng, int64_t(O) * I);
  const auto bias = random_vec(rng, O), dy = random_vec(rng, int64_t(B) * O);
  std::vector<float> y(int64_t(B) * O), dx(x.size()), dw(w.size()), db(O);
  const double flop = 2.0 * B * I * O;
  std::printf("linear %d->%d, batch %d\n", I, O, B);
  report("forward", flop, best_ms([&] {
           linear_forward(y.data(), x.data(), w.data(), bias.data(), B, I, O);
         }));
  report("backward (dinp, dweight, dbias)", 2 * flop, best_ms([&] {
           linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), B, I,
                           O, false);
         }));
}

void bench_conv(const Conv2dShape& s, bool need_dinp) {
  Rng rng(3);
  const int64_t n_in = int64_t(s.B) * s.C * s.H * s.W;
  const int64_t n_w = int64_t(s.OC) * s.C * s.KH * s.KW;
  const int64_t n_out = int64_t(s.B) * s.OC * s.OH() * s.OW();
  const auto x = random_vec(rng, n_in), w = random_vec(rng, n_w), bias = random_vec(rng, s.OC);
  const auto dy = random_vec(rng, n_out);
  std::vector<float> y(n_out), dx(n_in), dw(n_w), db(s.OC), scratch(conv2d_scratch_size(s));
  const double flop = 2.0 * n_out * s.C * s.KH * s.KW;
  std::printf("conv %d->%d %dx%d, %dx%d kernel, stride %d, pad %d, batch %d (scratch %.2f MB)\n",
              s.C, s.OC, s.H, s.W, s.KH, s.KW, s.stride, s.pad, s.B,
              double(scratch.size()) * 4e-6);
  const double fwd = best_ms([&] {
    conv2d_forward(y.data(), x.data(), w.data(), bias.data(), s, scratch.data());
  });
  const double bwd = best_ms([&] {
    conv2d_backward(need_dinp ? dx.data() : nullptr, dw.data(), db.data(), dy.data(), x.data(),
                    w.data(), s, scratch.data(), false);
  });
  const double bwd_flop = flop * (need_dinp ? 2 : 1);
  report("forward", flop, fwd);
  report(need_dinp ? "backward (dinp, dweight, dbias)" : "backward (dweight, dbias)", bwd_flop,
         bwd);
  report("forward + backward", flop + bwd_flop, fwd + bwd);
}

// 2x2 max pooling, stride 2, on a conv output of the CNN (B, C, H, W): GB/s of the bytes each
// pass moves (forward: input read, output and argmax written; backward: gradient and argmax
// read, input gradient written).
void bench_maxpool(int B, int C, int H, int W) {
  Rng rng(4);
  const int64_t n_in = int64_t(B) * C * H * W, n_out = n_in / 4;
  const auto x = random_vec(rng, n_in), dy = random_vec(rng, n_out);
  std::vector<float> y(n_out), dx(n_in);
  std::vector<int32_t> am(n_out);
  std::printf("maxpool 2x2/2 on %d x %d x %d x %d\n", B, C, H, W);
  const double fwd = best_ms([&] {
    maxpool2d_forward(y.data(), am.data(), x.data(), B, C, H, W, 2, 2);
  });
  const double bwd = best_ms([&] {
    maxpool2d_backward(dx.data(), dy.data(), am.data(), B, C, H, W, 2, 2);
  });
  const double bytes = 4.0 * (n_in + 2 * n_out);
  std::printf("  %-34s %8.3f ms %7.1f GB/s\n", "forward", fwd, bytes / fwd * 1e-6);
  std::printf("  %-34s %8.3f ms %7.1f GB/s\n", "backward", bwd, bytes / bwd * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_runs = std::max(1, std::atoi(argv[1]));
  blas_init(1);
  std::printf("OpenBLAS %s kernels, 1 thread, best of %d runs (thread CPU time)\n",
              blas_corename(), g_runs);
  bench_sgemm(1024);
  const int B = 64;
  bench_linear(B, 784, 256);
  bench_linear(B, 256, 128);
  bench_linear(B, 128, 10);
  bench_conv({B, 1, 28, 28, 32, 3, 3, 1, 1}, false);  // first layer: no dinp
  bench_conv({B, 32, 14, 14, 64, 3, 3, 1, 1}, true);
  bench_maxpool(2, 32, 28, 28);  // the CNN's ConvPool chunks: conv1's output, two samples
  bench_maxpool(B, 64, 14, 14);  // conv2's, the whole batch in one chunk
  return 0;
}
