// The micro-benchmarks' clock: thread CPU time, so that other processes on a shared machine do
// not count, and the best of N runs after a warm-up.
#pragma once
#include <time.h>

#include <algorithm>

namespace bench {

inline double thread_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

// f once to warm up (page faults, library buffers), then the least of `runs` timed calls, in ms.
template <class F>
double best_ms(int runs, F f) {
  f();
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const double t0 = thread_ms();
    f();
    best = std::min(best, thread_ms() - t0);
  }
  return best;
}

}  // namespace bench
