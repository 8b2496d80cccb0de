// The optimizer's update when it writes a memory checkpoint's next generation itself
// (run/update_generations.h): SGD with momentum out of place (sgd_update_to, with the lane
// sums) through the cache, through the cache with the new momentum written over the gradient
// (backward wrote the gradient into the target's momentum: "over grad", what the runtime does
// when the target's exchange is done), and past the cache (streaming stores), against the
// same update in place, the baseline. Each call reads one generation and writes the other,
// alternating, as the memory checkpoints do; each first writes the gradient (backward's
// stores). Microseconds per update, best of N runs of thread CPU time; the last column is
// the store Optimizer picks (kStreamAbove).
//   usage: bench_update [runs (default 50)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/optim.h"
#include "strata/kernels_cpu.h"
#include "strata/lane_sums.h"
#include "strata/tensor.h"
#include "thread_timing.h"

int main(int argc, char** argv) {
  using namespace strata;
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  std::printf("%-9s %8s %9s %9s %9s %9s %7s %7s\n", "params", "MiB/upd", "in place", "to cached",
              "over grad", "to strm", "cached", "picks");
  std::printf("%-9s %8s %9s %9s %9s %9s %7s %7s\n", "", "written", "us", "us", "us", "us", "/strm", "");
  // The MLP's 235k parameters, and sizes across the last-level cache.
  for (int64_t n : {int64_t(235200), int64_t(1) << 19, int64_t(1) << 20, int64_t(3) << 19, int64_t(1) << 21}) {
    std::vector<float> grad(static_cast<size_t>(n), 1e-3f), g(static_cast<size_t>(n));
    Tensor p[2] = {Tensor({n}), Tensor({n})}, m[2] = {Tensor({n}), Tensor({n})};
    for (Tensor* t : {&p[0], &p[1], &m[0], &m[1]})
      for (int64_t i = 0; i < n; ++i) (*t)[i] = 0.01f * float(i % 97);
    uint32_t sums[2 * kRunningWords] = {};
    int k = 0;
    // Each arm first writes the step's gradient where backward would (timed with it): its own
    // buffer, or (over grad) the target's momentum, which the update then writes in place.
    auto backward = [&](float* at) { std::copy(grad.begin(), grad.end(), at); };
    auto to = [&](bool stream, bool over_grad) {
      float* gr = over_grad ? m[k ^ 1].data() : g.data();
      backward(gr);
      cpu::sgd_update_to(p[k].data(), gr, m[k].data(), p[k ^ 1].data(), m[k ^ 1].data(), n,
                         0.01f, 0.9f, 0.f, false, false, sums, stream);
      k ^= 1;
    };
    const double in_place = 1e3 * bench::best_ms(runs, [&] {
      backward(g.data());
      cpu::sgd_update(p[0].data(), g.data(), m[0].data(), n, 0.01f, 0.9f, 0.f, false, false);
    });
    const double cached = 1e3 * bench::best_ms(runs, [&] { to(false, false); });
    const double over = 1e3 * bench::best_ms(runs, [&] { to(false, true); });
    const double streamed = 1e3 * bench::best_ms(runs, [&] { to(true, false); });
    const int64_t written = int64_t(sizeof(float)) * n * 2;
    std::printf("%-9lld %8.1f %9.1f %9.1f %9.1f %9.1f %7.2f %7s\n", static_cast<long long>(n),
                double(written) / (1 << 20), in_place, cached, over, streamed, cached / streamed,
                written > Optimizer::kStreamAbove ? "stream" : "cached");
  }
  return 0;
}
