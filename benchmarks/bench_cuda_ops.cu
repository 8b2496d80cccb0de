// Throughput of the CUDA kernels against the device's peak and against the CPU kernels, in the
// same run: linear forward (the GEMM with its bias epilogue) on MLP shapes, and conv2d forward
// and backward on a small CNN's layers and on a larger one, in fp32 and bf16.
//
// Each GPU figure is the median of --runs timings (cudaEvent pairs on the compute stream) after
// 3 warm-up runs; each CPU figure is one run of the CPU kernel on the same inputs (its output
// is also the reference the GPU result is validated against before timing: "err" column,
// norm-wise max|gpu - cpu| / max|cpu|). Without a GPU it says so and exits 0.
//
//   usage: bench_cuda_ops [--runs N (20)] [--cpu-threads N (all cores)] [--no-cpu]
//                         [--peak-tflops X (fp32 peak)] [--peak-tflops-bf16 X]
//
// Peak: SM count x max SM clock (cudaDevAttrClockRate) x FLOP/clock/SM for the compute
// capability (peak_flop_per_clock below). Vendors quote tensor-core peaks at a lower clock than
// the maximum, so the computed peak can exceed the datasheet's by a few percent; pass the
// datasheet figure with --peak-tflops* to compare against it instead.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/kernels_cuda.h"
#include "strata/rng.h"

namespace {

using strata::Conv2dShape;

#define BENCH_CHECK(call)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,           \
                   cudaGetErrorString(e_));                                                \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

struct Options {
  int runs = 20;
  int cpu_threads = 0;  // 0: all cores
  bool cpu = true;
  double peak_fp32_tflops = 0, peak_bf16_tflops = 0;  // 0: computed
};

// Dense FLOP per clock per SM: {fp32 (FFMA on CUDA cores), bf16 (tensor cores, fp32
// accumulate)}; 0 = unknown. FP32: CUDA C++ Programming Guide, "Arithmetic Instructions"
// (32-bit multiply-add results per clock per SM: 64 on 7.x and 8.0, 128 on 8.6, 8.9, 9.0 and
// later; an FMA is 2 FLOP). BF16: NVIDIA's architecture whitepapers' dense peaks divided by
// SMs x boost clock: A100 312 TFLOPS / (108 SMs x 1.41 GHz) = 2048 (1024 FMA); H100 SXM5
// 989.4 TFLOPS / (132 SMs x 1.83 GHz) = 4096 (2048 FMA); Ada/Ampere GA10x 1024 for the
// professional parts (GeForce runs fp32 accumulation at half that); B200 ~8192 (2.25 PFLOPS
// dense, 148 SMs). Turing and Volta have no bf16 tensor cores.
struct PerClock {
  double fp32, bf16;
};
PerClock peak_flop_per_clock(int major, int minor) {
  if (major == 7) return {128, 0};
  if (major == 8 && minor == 0) return {128, 2048};
  if (major == 8) return {256, 1024};
  if (major == 9) return {256, 4096};
  if (major == 10) return {256, 8192};
  return {256, 0};
}

struct Device {
  std::string name;
  double peak_fp32 = 0, peak_bf16 = 0;  // FLOP/s
};

std::vector<float> random_vector(uint64_t seed, size_t n) {
  strata::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(-1.f, 1.f);
  return v;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = std::fabs(double(got[i]) - double(ref[i]));
    if (std::isnan(d)) d = INFINITY;
    max_diff = std::max(max_diff, d);
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// A device copy of a host vector, freed at scope exit.
struct DeviceVec {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(size_t count) : n(count) {
    p = static_cast<float*>(strata::cuda::alloc(sizeof(float) * std::max<size_t>(n, 1)));
  }
  explicit DeviceVec(const std::vector<float>& h) : DeviceVec(h.size()) {
    strata::cuda::upload(p, h.data(), sizeof(float) * n);
  }
  ~DeviceVec() { strata::cuda::release(p); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  std::vector<float> download() const {
    std::vector<float> h(n);
    strata::cuda::download(h.data(), p, sizeof(float) * n);
    return h;
  }
};

// Median milliseconds of `runs` GPU runs of f after 3 warm-up runs.
template <class F>
double gpu_median_ms(int runs, F f) {
  auto stream = static_cast<cudaStream_t>(strata::cuda::stream());
  for (int i = 0; i < 3; ++i) f();
  std::vector<cudaEvent_t> ev(2 * size_t(runs));
  for (auto& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < runs; ++r) {
    BENCH_CHECK(cudaEventRecord(ev[2 * r], stream));
    f();
    BENCH_CHECK(cudaEventRecord(ev[2 * r + 1], stream));
  }
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(runs);
  for (int r = 0; r < runs; ++r) {
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, ev[2 * r], ev[2 * r + 1]));
    ms[r] = t;
  }
  for (auto& e : ev) BENCH_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
}

template <class F>
double cpu_once_ms(F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void print_header() {
  std::printf("%-44s %-4s %9s %9s %6s | %9s %8s %8s | %9s\n", "op", "prec", "gpu ms", "GFLOP/s",
              "%peak", "cpu ms", "GFLOP/s", "gpu/cpu", "err");
}

// Results further from the CPU than this fail the benchmark (exit 1), so the GPU check catches
// an algorithm that changes the sums: fp32 direct sums measured 7e-7..3.5e-6 on an H200 (a
// Winograd or FFT convolution 4e-5..1.7e-4); bf16 rounds inputs to 8 bits (~4e-3 measured).
constexpr double kFp32ErrLimit = 2e-5, kBf16ErrLimit = 3e-2;
int g_over_limit = 0;

void print_row(const std::string& op, bool bf16, double flop, double gpu_ms, double cpu_ms,
               double err, const Device& dev) {
  const double gpu_gflops = flop / gpu_ms * 1e-6;
  const double peak = bf16 ? dev.peak_bf16 : dev.peak_fp32;
  char pct[16] = "-";
  if (peak > 0) std::snprintf(pct, sizeof pct, "%.1f", 100.0 * gpu_gflops * 1e9 / peak);
  if (cpu_ms > 0)
    std::printf("%-44s %-4s %9.3f %9.0f %6s | %9.2f %8.1f %7.0fx | %9.2e\n", op.c_str(),
                bf16 ? "bf16" : "fp32", gpu_ms, gpu_gflops, pct, cpu_ms, flop / cpu_ms * 1e-6,
                cpu_ms / gpu_ms, err);
  else
    std::printf("%-44s %-4s %9.3f %9.0f %6s | %9s %8s %8s | %9s\n", op.c_str(),
                bf16 ? "bf16" : "fp32", gpu_ms, gpu_gflops, pct, "-", "-", "-", "-");
  if (cpu_ms > 0 && !(err <= (bf16 ? kBf16ErrLimit : kFp32ErrLimit))) {
    std::printf("  ERROR: %s %s is %.2e from the CPU, over the limit %.0e\n", op.c_str(),
                bf16 ? "bf16" : "fp32", err, bf16 ? kBf16ErrLimit : kFp32ErrLimit);
    ++g_over_limit;
  }
}

// out (B,O) = inp (B,I) @ weight (O,I)^T + bias: the GPU in fp32 and bf16, the CPU once.
void bench_linear(int B, int I, int O, const Options& opt, const Device& dev) {
  const auto x = random_vector(1, size_t(B) * I), w = random_vector(2, size_t(O) * I);
  const auto bias = random_vector(3, O);
  std::vector<float> ref(size_t(B) * O);
  double cpu_ms = 0;
  if (opt.cpu)
    cpu_ms = cpu_once_ms([&] {
      strata::cpu::linear_forward(ref.data(), x.data(), w.data(), bias.data(), B, I, O);
    });
  DeviceVec dx(x), dw(w), db(bias), dy(size_t(B) * O);
  const double flop = 2.0 * B * I * O;
  char op[64];
  std::snprintf(op, sizeof op, "linear fwd B=%d %d->%d", B, I, O);
  for (bool bf16 : {false, true}) {
    strata::cuda::Bf16Scope precision(bf16);
    auto run = [&] { strata::cuda::linear_forward(dy.p, dx.p, dw.p, db.p, B, I, O); };
    run();
    const double err = opt.cpu ? relative_error(dy.download(), ref) : 0;
    print_row(op, bf16, flop, gpu_median_ms(opt.runs, run), cpu_ms, err, dev);
  }
}

// conv2d forward, and backward (dinp when wanted, dweight, dbias).
void bench_conv(const Conv2dShape& s, bool need_dinp, const Options& opt, const Device& dev) {
  const size_t n_in = size_t(s.B) * s.C * s.H * s.W, n_w = size_t(s.OC) * s.C * s.KH * s.KW;
  const size_t n_out = size_t(s.B) * s.OC * s.OH() * s.OW();
  const auto x = random_vector(4, n_in), w = random_vector(5, n_w), bias = random_vector(6, s.OC);
  const auto dyv = random_vector(7, n_out);
  std::vector<float> ref_y(n_out), ref_dx(need_dinp ? n_in : 0), ref_dw(n_w), ref_db(s.OC);
  double cpu_fwd = 0, cpu_bwd = 0;
  if (opt.cpu) {
    std::vector<float> scratch(size_t(strata::cpu::conv2d_scratch_size(s)));
    cpu_fwd = cpu_once_ms([&] {
      strata::cpu::conv2d_forward(ref_y.data(), x.data(), w.data(), bias.data(), s, scratch.data());
    });
    cpu_bwd = cpu_once_ms([&] {
      strata::cpu::conv2d_backward(need_dinp ? ref_dx.data() : nullptr, ref_dw.data(),
                                   ref_db.data(), dyv.data(), x.data(), w.data(), s,
                                   scratch.data(), false);
    });
  }
  DeviceVec dx(x), dw(w), db(bias), dyd(dyv), y(n_out), gx(n_in), gw(n_w), gb(size_t(s.OC));
  const double flop = 2.0 * double(n_out) * s.C * s.KH * s.KW;
  char shape[64];
  std::snprintf(shape, sizeof shape, "B=%d %d->%d %dx%d on %dx%d s%d", s.B, s.C, s.OC, s.KH, s.KW,
                s.H, s.W, s.stride);
  for (bool bf16 : {false, true}) {
    strata::cuda::Bf16Scope precision(bf16);
    DeviceVec scratch(size_t(strata::cuda::conv2d_scratch_size(s)));
    auto fwd = [&] { strata::cuda::conv2d_forward(y.p, dx.p, dw.p, db.p, s, scratch.p); };
    auto bwd = [&] {
      strata::cuda::conv2d_backward(need_dinp ? gx.p : nullptr, gw.p, gb.p, dyd.p, dx.p, dw.p, s,
                                    scratch.p, false);
    };
    fwd();
    bwd();
    double err_f = 0, err_b = 0;
    if (opt.cpu) {
      err_f = relative_error(y.download(), ref_y);
      err_b = relative_error(gw.download(), ref_dw);
      if (need_dinp) {
        std::vector<float> got = gx.download();
        err_b = std::max(err_b, relative_error(got, ref_dx));
      }
    }
    print_row(std::string("conv fwd ") + shape, bf16, flop, gpu_median_ms(opt.runs, fwd), cpu_fwd,
              err_f, dev);
    print_row(std::string(need_dinp ? "conv bwd " : "conv bwd(no dinp) ") + shape, bf16,
              flop * (need_dinp ? 2 : 1), gpu_median_ms(opt.runs, bwd), cpu_bwd, err_b, dev);
    std::printf("  cuDNN %s: %s\n", bf16 ? "bf16" : "fp32", strata::cuda::conv2d_algorithms(s).c_str());
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_ops: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs")
      o.runs = std::max(1, std::atoi(value()));
    else if (a == "--cpu-threads")
      o.cpu_threads = std::atoi(value());
    else if (a == "--no-cpu")
      o.cpu = false;
    else if (a == "--peak-tflops")
      o.peak_fp32_tflops = std::atof(value());
    else if (a == "--peak-tflops-bf16")
      o.peak_bf16_tflops = std::atof(value());
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda_ops [--runs N] [--cpu-threads N] [--no-cpu] "
                   "[--peak-tflops X] [--peak-tflops-bf16 X]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  std::string why;
  if (strata::cuda::device_count(&why) == 0) {
    std::printf("bench_cuda_ops: no GPU visible (%s); nothing to measure\n", why.c_str());
    return 0;
  }
  strata::cuda::init(0);
  Device dev;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const PerClock pc = peak_flop_per_clock(prop.major, prop.minor);
  const double clocks = double(prop.multiProcessorCount) * clock_khz * 1e3;
  dev.name = prop.name;
  dev.peak_fp32 = opt.peak_fp32_tflops > 0 ? opt.peak_fp32_tflops * 1e12 : clocks * pc.fp32;
  dev.peak_bf16 = opt.peak_bf16_tflops > 0 ? opt.peak_bf16_tflops * 1e12 : clocks * pc.bf16;
  const int threads =
      opt.cpu_threads > 0 ? opt.cpu_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  strata::cpu::blas_init(threads);
  std::printf("GPU %s (sm_%d%d, %d SMs, %.0f MHz): peak fp32 %.1f TFLOP/s%s, bf16 %.1f TFLOP/s%s\n",
              dev.name.c_str(), prop.major, prop.minor, prop.multiProcessorCount,
              clock_khz * 1e-3, dev.peak_fp32 * 1e-12,
              opt.peak_fp32_tflops > 0 ? " (given)" : "", dev.peak_bf16 * 1e-12,
              opt.peak_bf16_tflops > 0 ? " (given)" : "");
  std::printf("CPU baseline: %s, %d threads, one run each%s\n", strata::cpu::blas_corename(),
              threads, opt.cpu ? "" : " (off)");
  std::printf("GPU: median of %d runs after 3 warm-up; err = max|gpu-cpu|/max|cpu| (bf16 ~1e-2 "
              "expected, fp32 ~1e-6)\n\n",
              opt.runs);
  print_header();
  const int mlp[][3] = {{256, 784, 1024},  {256, 1024, 1024},  {256, 4096, 4096},
                        {4096, 784, 1024}, {4096, 1024, 1024}, {4096, 4096, 4096}};
  for (const auto& m : mlp) bench_linear(m[0], m[1], m[2], opt, dev);
  // The benchmark CNN's two convolutions (bench_kernels.cpp) at batch 256, and a ResNet-like
  // layer: 64 -> 128 channels, 3x3 on 56x56.
  bench_conv({256, 1, 28, 28, 32, 3, 3, 1, 1}, false, opt, dev);
  bench_conv({256, 32, 14, 14, 64, 3, 3, 1, 1}, true, opt, dev);
  bench_conv({256, 64, 56, 56, 128, 3, 3, 1, 1}, true, opt, dev);
  if (g_over_limit) std::printf("\n%d results over their error limit\n", g_over_limit);
  return g_over_limit ? 1 : 0;
}
