// strata's GEMM (oneDNN's sgemm) against OpenBLAS on the shapes of a training step, in the same
// run. OpenBLAS is loaded with dlopen after setting OPENBLAS_CORETYPE from cpuid, so it gets
// its fastest kernels too (on VMs its own detection falls back to SSE3: ../shared/FACTS.md).
// Each figure is the median of N calls of thread CPU time (robust to other processes), also as a
// share of this core's FMA peak, measured first.
//   usage: bench_gemm [calls (default 60)]        needs libopenblas0 installed for the baseline
//          bench_gemm --peak    only the two peaks, as one JSON line (benchmarks/bench_roofline.py)
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_gemm.h"
#include "strata/kernels_cpu.h"

namespace {

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // cblas.h

CblasSgemm load_openblas(const char** core) {
  __builtin_cpu_init();
  // The fastest kernels for this CPU, whatever OPENBLAS_CORETYPE the environment brings (an
  // image here set Haswell on an AVX-512 CPU); BENCH_OPENBLAS_CORETYPE chooses explicitly.
  if (const char* c = getenv("BENCH_OPENBLAS_CORETYPE"); c && *c)
    setenv("OPENBLAS_CORETYPE", c, 1);
  else if (__builtin_cpu_supports("avx512f"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  else if (__builtin_cpu_supports("avx2"))
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto name = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
  *core = name ? name() : "?";
  return reinterpret_cast<CblasSgemm>(dlsym(lib, "cblas_sgemm"));
}

// This core's fp32 FMA throughput (GFLOP/s of thread CPU time): 12 independent chains of
// 512-bit (or, without AVX-512, 256-bit) FMAs on registers, enough to fill two FMA pipes of
// 4-cycle latency. The ceiling every GEMM above is measured against. 0 off x86-64.
#if defined(__x86_64__)
// vfmadd231ps into registers 0-11 of the given kind (zmm or ymm) from registers 14 and 15.
#define STRATA_FMA(r, i) "vfmadd231ps %%" r "14, %%" r "15, %%" r #i "\n"
#define STRATA_FMA12(r)                                                                  \
  STRATA_FMA(r, 0) STRATA_FMA(r, 1) STRATA_FMA(r, 2) STRATA_FMA(r, 3) STRATA_FMA(r, 4)   \
  STRATA_FMA(r, 5) STRATA_FMA(r, 6) STRATA_FMA(r, 7) STRATA_FMA(r, 8) STRATA_FMA(r, 9)   \
  STRATA_FMA(r, 10) STRATA_FMA(r, 11)
#define STRATA_ZERO(i) "vxorps %%xmm" #i ", %%xmm" #i ", %%xmm" #i "\n"
// Registers zeroed first: whatever they held (a denormal, a NaN) could slow the FMAs down.
#define STRATA_FMA_PEAK(name, isa, r, lanes)                                              \
  __attribute__((target(isa))) double name(long n) {                                     \
    asm volatile(STRATA_ZERO(0) STRATA_ZERO(1) STRATA_ZERO(2) STRATA_ZERO(3) STRATA_ZERO(4) \
                 STRATA_ZERO(5) STRATA_ZERO(6) STRATA_ZERO(7) STRATA_ZERO(8) STRATA_ZERO(9) \
                 STRATA_ZERO(10) STRATA_ZERO(11) STRATA_ZERO(14) STRATA_ZERO(15)::          \
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",      \
                       "xmm8", "xmm9", "xmm10", "xmm11", "xmm14", "xmm15");                 \
    const double t0 = thread_s();                                                        \
    for (long i = 0; i < n; ++i)                                                         \
      asm volatile(STRATA_FMA12(r)::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",    \
                   "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");                    \
    return double(n) * 12 * 2 * lanes / (thread_s() - t0) * 1e-9;                        \
  }
STRATA_FMA_PEAK(fma_peak_avx512, "avx512f", "zmm", 16)
STRATA_FMA_PEAK(fma_peak_avx2, "avx2,fma", "ymm", 8)
// The bf16 ceiling: vdpbf16ps (AVX512_BF16) does 16 lanes x 2 bf16 products per instruction.
#undef STRATA_FMA
#define STRATA_FMA(r, i) "vdpbf16ps %%" r "14, %%" r "15, %%" r #i "\n"
STRATA_FMA_PEAK(dpbf16_peak_avx512, "avx512f,avx512bf16", "zmm", 32)
#endif

// The best of 5 runs of about 0.2 s each (the core's clock settles in the first).
double fma_peak(const char** isa) {
  double best = 0;
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f");
  *isa = avx512 ? "AVX-512" : "AVX2";
  if (!avx512 && !__builtin_cpu_supports("fma")) return 0;
  for (int r = 0; r < 5; ++r)
    best = std::max(best, avx512 ? fma_peak_avx512(40'000'000) : fma_peak_avx2(40'000'000));
#else
  *isa = "none";
#endif
  return best;
}

// This core's bf16 dot-product throughput (vdpbf16ps), 0 without AVX512_BF16.
double bf16_peak() {
  double best = 0;
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) return 0;
  for (int r = 0; r < 5; ++r) best = std::max(best, dpbf16_peak_avx512(40'000'000));
#endif
  return best;
}

struct Shape {
  bool ta, tb;
  int M, N, K;
  const char* what;
};

// train.precision = "bf16": the GPT's products as its linear op runs them (kernels/cpu/linear.cpp:
// A rounded to bf16, B rounded straight into the layout oneDNN's bf16 kernels read, then the
// matmul), beside the matmul alone on bf16 copies as they are (the kernels then copy B into
// their layout themselves) and the fp32 sgemm, against the core's bf16 peak.
void bench_bf16(const Shape* shapes, int n, int calls) {
  std::string why;
  if (!strata::cpu::bf16_supported(&why)) {
    std::printf("\nbf16: not measured (%s)\n", why.c_str());
    return;
  }
  const double peak = bf16_peak();
  std::printf("\nbf16 (%s): this core's bf16 peak %.1f GFLOP/s (vdpbf16ps, 12 chains)\n",
              strata::cpu::bf16_matmul_kernels().c_str(), peak);
  std::printf("%-24s %11s %9s %6s %11s %9s %6s %10s %7s\n", "shape (M,N,K)", "op us", "GFLOP/s",
              "peak", "matmul us", "GFLOP/s", "peak", "fp32 us", "op/fp32");
  using strata::cpu::bf16_t;
  for (int i = 0; i < n; ++i) {
    const Shape& s = shapes[i];
    std::vector<float> A(size_t(s.M) * s.K, 0.25f), B(size_t(s.K) * s.N, 0.5f), C(size_t(s.M) * s.N);
    std::vector<bf16_t> Ab(A.size()), Bb(B.size());
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto matmul = [&] {
      strata::cpu::matmul_bf16(s.ta, s.tb, s.M, s.N, s.K, Ab.data(), lda, Bb.data(), ldb, C.data(),
                               s.N, nullptr, false, false);
    };
    const double op = median_s(calls, [&] {  // B rounded into the kernels' layout as it goes
      strata::cpu::to_bf16(Ab.data(), A.data(), int64_t(A.size()));
      strata::cpu::matmul_bf16_rounding_b(s.ta, s.tb, s.M, s.N, s.K, Ab.data(), lda, B.data(), ldb,
                                          C.data(), s.N, nullptr, false, false);
    });
    strata::cpu::to_bf16(Bb.data(), B.data(), int64_t(B.size()));  // for the matmul alone
    const double mm = median_s(calls, matmul);
    const double f32 = median_s(calls, [&] {
      strata::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), s.N);
    });
    const double gf = 2.0 * s.M * s.N * s.K * 1e-9;
    auto share = [&](double t) { return peak > 0 ? 100 * gf / t / peak : 0.0; };
    std::printf("%-24s %11.1f %9.0f %5.0f%% %11.1f %9.0f %5.0f%% %10.1f %6.2fx\n", s.what, op * 1e6,
                gf / op, share(op), mm * 1e6, gf / mm, share(mm), f32 * 1e6, f32 / op);
  }
}

// The fp32 forward products as the linear op runs them (strata::cpu::linear[_relu]_forward: the
// matmul primitive with bias and ReLU in its epilogue from 2^20 multiply-adds, else sgemm and
// a bias pass; from 2048 rows the weight reordered first, at each call) beside the candidate of
// issue 34: the same matmul primitive with its weights in the blocked layout it asks for
// (format_tag::any), reordered from the row-major weights once per weight version; and the
// primitive on the row-major weights ("row-major": the op's path below 2048 rows, and at 2048
// before issue 34). A training step changes every weight once and runs one forward with
// each per micro-batch, so "per step" charges the whole reorder to one call (the plain
// one-micro-batch step; k micro-batches would charge 1/k of it); "speedup" is the op's time
// over that. "same" says whether the packed
// product is bitwise the op's.
struct Forward {
  int B, O, I;  // out (B,O) = inp (B,I) @ weight (O,I)^T + bias
  bool relu;
  const char* what;
};

void bench_forward(double peak, int calls) {
  using namespace dnnl;
  using dt = memory::data_type;
  using dims = memory::dims;
  const Forward fwd[] = {
      {64, 256, 784, true, "MLP fc1 forward"},     {64, 128, 256, true, "MLP fc2 forward"},
      {64, 10, 128, false, "MLP fc3 forward"},     {2048, 1152, 384, false, "GPT c_attn forward"},
      {2048, 1536, 384, false, "GPT c_fc forward"}, {2048, 384, 1536, false, "GPT c_proj forward"}};
  std::printf("\nfp32 forward products as the linear op runs them (bias; ReLU for fc1, fc2), "
              "against packed weights\n%-20s %9s %6s %10s %6s %10s %6s %10s %10s %6s %7s %5s\n",
              "shape (B,O,I)", "op us", "peak", "row-major", "peak", "packed us", "peak",
              "reorder us", "per step", "peak", "speedup", "same");
  const engine eng(engine::kind::cpu, 0);
  stream st(eng);
  for (const Forward& f : fwd) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> x(size_t(f.B) * f.I), w(size_t(f.O) * f.I), bias(f.O),
        y1(size_t(f.B) * f.O), y2(y1.size());
    for (auto* v : {&x, &w, &bias})
      for (float& e : *v) e = u(gen);
    const double op = median_s(calls, [&] {
      if (f.relu)
        strata::cpu::linear_relu_forward(y1.data(), x.data(), w.data(), bias.data(), f.B, f.I,
                                         f.O);
      else
        strata::cpu::linear_forward(y1.data(), x.data(), w.data(), bias.data(), f.B, f.I, f.O);
    });
    const double rm = median_s(calls, [&] {
      strata::cpu::matmul(false, true, f.B, f.O, f.I, x.data(), f.I, w.data(), f.I, y2.data(), f.O,
                          bias.data(), f.relu);
    });
    // The weight (O,I) row-major is op(B) = weight^T (I,O) with strides {1, I}.
    const memory::desc x_md(dims{f.B, f.I}, dt::f32, dims{f.I, 1});
    const memory::desc w_md(dims{f.I, f.O}, dt::f32, dims{1, f.I});
    const memory::desc w_any(dims{f.I, f.O}, dt::f32, memory::format_tag::any);
    const memory::desc y_md(dims{f.B, f.O}, dt::f32, dims{f.O, 1});
    const memory::desc b_md(dims{1, f.O}, dt::f32, dims{f.O, 1});
    primitive_attr attr;
    if (f.relu) {
      post_ops ops;
      ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    const matmul::primitive_desc pd(matmul::desc(x_md, w_any, b_md, y_md), attr, eng);
    const matmul prim(pd);
    memory xm(x_md, eng, x.data()), wm(w_md, eng, w.data()), ym(y_md, eng, y2.data()),
        bm(b_md, eng, bias.data()), packed(pd.weights_desc(), eng);
    const reorder pack(wm, packed);
    const double re = median_s(calls, [&] { pack.execute(st, wm, packed); });
    const double pk = median_s(calls, [&] {
      prim.execute(st, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, packed}, {DNNL_ARG_BIAS, bm},
                        {DNNL_ARG_DST, ym}});
    });
    st.wait();
    const bool same = std::memcmp(y1.data(), y2.data(), sizeof(float) * y1.size()) == 0;
    const double gf = 2.0 * f.B * f.O * f.I * 1e-9;
    auto share = [&](double t) { return peak > 0 ? 100 * gf / t / peak : 0.0; };
    std::printf("%-20s %9.1f %5.0f%% %10.1f %5.0f%% %10.1f %5.0f%% %10.1f %10.1f %5.0f%% %6.2fx "
                "%5s\n",
                f.what, op * 1e6, share(op), rm * 1e6, share(rm), pk * 1e6, share(pk), re * 1e6,
                (pk + re) * 1e6, share(pk + re), op / (pk + re), same ? "yes" : "no");
  }
}

// /proc/cpuinfo's first "model name", "?" where there is none.
std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  std::string name = "?";
  char line[512];
  while (f && std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "model name", 10) == 0) {
      if (const char* c = std::strchr(line, ':')) name = c + 1 + std::strspn(c + 1, " \t");
      name.erase(name.find_last_not_of(" \t\n") + 1);
      break;
    }
  if (f) std::fclose(f);
  return name;
}

// --peak: {"cpu": ..., "isa": ..., "fp32_gflops": ..., "bf16_gflops": ... or null}. Only what
// the core does on registers: no GEMM, no OpenBLAS needed.
int print_peaks() {
  const char* isa = "";
  const double fp32 = fma_peak(&isa), bf16 = bf16_peak();
  std::string name;
  for (char c : cpu_model()) {  // a JSON string: quotes and backslashes escaped
    if (c == '"' || c == '\\') name += '\\';
    name += c;
  }
  std::printf("{\"cpu\": \"%s\", \"isa\": \"%s\", \"fp32_gflops\": %.1f, \"bf16_gflops\": ",
              name.c_str(), isa, fp32);
  if (bf16 > 0)
    std::printf("%.1f}\n", bf16);
  else
    std::printf("null}\n");
  return fp32 > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--peak") == 0) return print_peaks();
  const int calls = argc > 1 ? std::atoi(argv[1]) : 60;
  strata::cpu::blas_init(1);
  const char* core = "";
  CblasSgemm openblas = load_openblas(&core);
  if (!openblas) {
    std::fprintf(stderr, "bench_gemm: libopenblas.so.0 not found (apt-get install libopenblas0)\n");
    return 1;
  }
  std::printf("strata: %s   baseline: OpenBLAS %s, 1 thread, median of %d calls\n",
              strata::cpu::blas_corename(), core, calls);
  const char* isa = "";
  const double peak = fma_peak(&isa);
  std::printf("this core's FMA peak: %.1f GFLOP/s (%s, 12 independent FMA chains)\n", peak, isa);
  const Shape shapes[] = {
      {false, true, 64, 256, 784, "MLP fc1 forward"},   {true, false, 256, 784, 64, "MLP fc1 dW"},
      {false, true, 64, 128, 256, "MLP fc2 forward"},   {false, false, 64, 256, 128, "MLP fc2 dX"},
      {true, false, 128, 256, 64, "MLP fc2 dW"},        {false, false, 64, 196, 288, "CNN conv2 fwd/sample"},
      {false, true, 64, 288, 196, "CNN conv2 dW/sample"}, {true, false, 288, 196, 64, "CNN conv2 dcols/sample"},
      // The GPT of benchmarks/bench_gpt.py (batch 8 x 256 positions, dim 384): y = x W^T,
      // dX = dY W, dW = dY^T X for c_attn (1152 x 384) and c_fc (1536 x 384).
      {false, true, 2048, 1152, 384, "GPT c_attn forward"}, {false, false, 2048, 384, 1152, "GPT c_attn dX"},
      {true, false, 1152, 384, 2048, "GPT c_attn dW"},      {false, true, 2048, 1536, 384, "GPT c_fc forward"},
      {false, false, 2048, 384, 1536, "GPT c_fc dX"},       {true, false, 1536, 384, 2048, "GPT c_fc dW"},
      // mlp c_proj (384 x 1536): its forward and dX have c_fc's dX and forward shapes.
      {true, false, 384, 1536, 2048, "GPT mlp c_proj dW"},
  };
  std::printf("%-24s %10s %9s %6s %10s %9s %6s %7s\n", "shape (M,N,K)", "strata us", "GFLOP/s",
              "peak", "OpenBLAS us", "GFLOP/s", "peak", "ratio");
  for (const Shape& s : shapes) {
    std::vector<float> A(size_t(s.M) * s.K, 0.25f), B(size_t(s.K) * s.N, 0.5f), C1(size_t(s.M) * s.N),
        C2(size_t(s.M) * s.N);
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const double a = median_s(calls, [&] {
      strata::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C1.data(), s.N);
    });
    const double b = median_s(calls, [&] {
      openblas(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N, s.K, 1.f,
               A.data(), lda, B.data(), ldb, 0.f, C2.data(), s.N);
    });
    double err = 0, scale = 0;  // validate: both computed the same product
    for (size_t i = 0; i < C1.size(); ++i) {
      err = std::max(err, double(std::abs(C1[i] - C2[i])));
      scale = std::max(scale, double(std::abs(C2[i])));
    }
    if (!(err <= 1e-5 * scale)) {
      std::fprintf(stderr, "bench_gemm: %s: results differ (%g of %g)\n", s.what, err, scale);
      return 1;
    }
    const double gf = 2.0 * s.M * s.N * s.K * 1e-9;
    auto share = [&](double t) { return peak > 0 ? 100 * gf / t / peak : 0.0; };
    std::printf("%-24s %10.1f %9.0f %5.0f%% %10.1f %9.0f %5.0f%% %6.2fx\n", s.what, a * 1e6, gf / a,
                share(a), b * 1e6, gf / b, share(b), b / a);
  }
  bench_forward(peak, calls);
  if (bench_small_products(peak, calls) != 0) return 1;
  bench_bf16(shapes, int(sizeof shapes / sizeof shapes[0]), calls);
}
