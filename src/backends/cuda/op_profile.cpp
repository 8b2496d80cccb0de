// STRATA_CUDA_PROFILE=1: each op of the CUDA table timed on the compute stream with CUDA events
// and summed per op, printed to stderr at exit (op, calls, GPU ms, share). Each op waits for
// its own end, so the profile serialises the stream: the shares are right, the step slower.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <vector>

#include "op_profile.h"
#include "strata/kernels_cuda.h"

namespace strata {
namespace {

struct Tally {
  double ms = 0;
  long calls = 0;
};
Tally g_tally[kNumOps];
std::once_flag g_print;

void print_profile() {
  double total = 0;
  for (const Tally& t : g_tally) total += t.ms;
  std::vector<int> order;
  for (int k = 0; k < kNumOps; ++k)
    if (g_tally[k].calls) order.push_back(k);
  std::sort(order.begin(), order.end(), [](int a, int b) { return g_tally[a].ms > g_tally[b].ms; });
  std::fprintf(stderr, "strata: CUDA op profile (STRATA_CUDA_PROFILE; each op timed alone):\n");
  for (int k : order)
    std::fprintf(stderr, "  %-24s %8ld calls %10.2f ms %6.1f %%\n", op_name(Op(k)), g_tally[k].calls,
                 g_tally[k].ms, total > 0 ? 100 * g_tally[k].ms / total : 0.0);
  std::fprintf(stderr, "  %-24s %8s       %10.2f ms\n", "all ops", "", total);
}

template <Op op, auto F>
struct Timed;
template <Op op, typename R, typename... A, R (*F)(A...)>
struct Timed<op, F> {
  static R call(A... a) {
    static cudaEvent_t start = nullptr, stop = nullptr;
    if (!start) {
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
    }
    auto s = static_cast<cudaStream_t>(cuda::stream());
    cudaEventRecord(start, s);
    auto finish = [&] {
      cudaEventRecord(stop, s);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      g_tally[int(op)].ms += ms;
      ++g_tally[int(op)].calls;
    };
    if constexpr (std::is_void_v<R>) {
      F(a...);
      finish();
    } else {
      R r = F(a...);
      finish();
      return r;
    }
  }
};

}  // namespace

void maybe_profile(Backend& t) {
  const char* v = std::getenv("STRATA_CUDA_PROFILE");
  if (!v || std::string_view(v) != "1") return;
#define STRATA_OP(name, ret, params) t.name = &Timed<Op::name, &cuda::name>::call;
#define STRATA_CPU_OP(name, ret, params)
#include "strata/ops.def"
  std::atexit([] { std::call_once(g_print, print_profile); });
}

}  // namespace strata
