// Timings of the GPT-2 kernels (attention, layernorm, embedding, residual) on one thread: the
// hidden [.bench] case, `OMP_NUM_THREADS=1 strata_unit_tests "gpt kernel timings*"`. The
// kernels' tests (against double references, by finite differences, thread counts, null and
// accumulated gradients) are in the op table, each in its op's family file (tests/ops,
// [cpu_kernel]).
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/rng.h"

using namespace strata;
using namespace strata::cpu;

namespace {

using Vec = std::vector<float>;

Vec rand_vec(Rng& rng, int64_t n, float lo = -1.f, float hi = 1.f) {
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Sets the OpenMP thread count for a scope and restores it after.
struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { blas_init(n); }
  ~Threads() { blas_init(saved); }
};

}  // namespace

// ---- Timings (hidden: strata_unit_tests "[.bench]") ----------------------------------------

namespace {

// Median over `reps` runs of f, after one warm-up run, in ms: of the wall time, and of this
// thread's CPU time (all the work runs on the calling thread at one thread; on a shared,
// loaded machine the CPU time is the steadier figure).
struct Timing {
  double wall, cpu;
};

double thread_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

template <class F>
Timing median_ms(int reps, F f) {
  f();
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    f();
    cpu.push_back(thread_cpu_ms() - c0);
    const auto t1 = std::chrono::steady_clock::now();
    wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace

TEST_CASE("gpt kernel timings, one thread", "[.bench]") {
  Threads threads(1);
  Rng rng(61);
  const int B = 8, T = 256, C = 384, NH = 6, N = B * T, reps = 11;
  const Vec qkv = rand_vec(rng, int64_t(N) * 3 * C), dout = rand_vec(rng, int64_t(N) * C);
  Vec out(size_t(N) * C), att(size_t(B) * NH * T * T), dqkv(size_t(N) * 3 * C);
  const Timing fwd = median_ms(reps, [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  });
  const Timing bwd = median_ms(reps, [&] {
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  });
  // Causal work: each of the 2 forward and 4 backward products is T(T+1)/2 * hs multiply-adds
  // per (b, h); GFLOP/s from the CPU time.
  const double gflop = 2.0 * B * NH * T * (T + 1) / 2 * (C / NH) * 1e-9;
  std::printf("attention B=%d T=%d C=%d NH=%d, ms wall / cpu: forward %.2f / %.2f (%.1f causal "
              "GFLOP/s), backward %.2f / %.2f (%.1f), forward+backward %.2f / %.2f\n",
              B, T, C, NH, fwd.wall, fwd.cpu, 2 * gflop / fwd.cpu * 1e3, bwd.wall, bwd.cpu,
              4 * gflop / bwd.cpu * 1e3, fwd.wall + bwd.wall, fwd.cpu + bwd.cpu);

  // The same products on bf16 copies (train.precision = "bf16"), where the CPU has them.
  if (std::string why; !bf16_supported(&why)) {
    std::printf("attention bf16: skipped: %s\n", why.c_str());
  } else {
    const Timing f16 = median_ms(reps, [&] {
      bf16::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    });
    const Timing b16 = median_ms(reps, [&] {
      bf16::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    });
    std::printf("attention bf16, ms wall / cpu: forward %.2f / %.2f (%.1f causal GFLOP/s), "
                "backward %.2f / %.2f (%.1f), forward+backward %.2f / %.2f (%.2fx fp32)\n",
                f16.wall, f16.cpu, 2 * gflop / f16.cpu * 1e3, b16.wall, b16.cpu,
                4 * gflop / b16.cpu * 1e3, f16.wall + b16.wall, f16.cpu + b16.cpu,
                (fwd.cpu + bwd.cpu) / (f16.cpu + b16.cpu));
  }

  const Vec x = rand_vec(rng, int64_t(N) * C), w = rand_vec(rng, C), b = rand_vec(rng, C);
  Vec y(size_t(N) * C), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      dx(size_t(N) * C), dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
  const Timing lf = median_ms(reps, [&] {
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  });
  const Timing lb = median_ms(reps, [&] {
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, C, true);
  });
  const double mb = double(N) * C * 4 / 1e6;  // MB of one (N,C) tensor
  std::printf("layernorm N=%d C=%d, ms wall / cpu: forward %.3f / %.3f (%.1f GB/s), backward "
              "%.3f / %.3f (%.1f GB/s), forward+backward %.3f / %.3f\n",
              N, C, lf.wall, lf.cpu, 2 * mb / lf.cpu, lb.wall, lb.cpu, 4 * mb / lb.cpu,
              lf.wall + lb.wall, lf.cpu + lb.cpu);

  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = int32_t(rng.below(256));
  const Vec wte = rand_vec(rng, 256 * C), wpe = rand_vec(rng, T * C);
  Vec dwte(size_t(256) * C), dwpe(size_t(T) * C);
  const Timing ef = median_ms(reps, [&] {
    embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 256);
  });
  const Timing eb = median_ms(reps, [&] {
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 256, false);
  });
  const Timing rf = median_ms(reps, [&] {
    residual_forward(y.data(), x.data(), dout.data(), int64_t(N) * C);
  });
  std::printf("embedding V=256, ms cpu: forward %.3f, backward %.3f; residual_forward %.3f\n",
              ef.cpu, eb.cpu, rf.cpu);
  CHECK(std::isfinite(fwd.cpu + bwd.cpu + lf.cpu + lb.cpu));
}
