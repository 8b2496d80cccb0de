// What bench_gemm.cpp and bench_gemm_ops.cpp share: the timing of a call.
#pragma once
#include <time.h>

#include <algorithm>
#include <vector>

// This thread's CPU time: robust to other processes on a shared machine.
inline double thread_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// The median of n calls of f, after one call to warm up.
template <class F>
double median_s(int n, F f) {
  f();
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    const double t0 = thread_s();
    f();
    v.push_back(thread_s() - t0);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The table of the MLP's and the CNN's fp32 products as the ops run them (bench_gemm_ops.cpp):
// 0, or 1 where an op's result and oneDNN's differ.
int bench_small_products(double peak, int calls);
