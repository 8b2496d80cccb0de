// A memory checkpoint's copy of a rank's state into its file (checkpoint/memory_checkpoints.h:
// PartWriter, the copy with its CRC-32C) against a plain memcpy of the same bytes, the floor;
// and the CRC alone (checkpoint/crc32c.h) against one chain of the crc32 instruction over the
// same bytes, the baseline. GB/s of each, best of N runs of thread CPU time (robust on a shared
// machine).
//   usage: bench_part_writer [runs (default 20)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/memory_checkpoints.h"
#include "thread_timing.h"

namespace {

// The baseline: CRC-32C as one chain of crc32 instructions, 8 bytes at a time (n % 8 == 0).
__attribute__((target("sse4.2"))) uint32_t one_chain(const unsigned char* p, size_t n) {
  uint64_t c = ~0u;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  return ~uint32_t(c);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  if (!__builtin_cpu_supports("sse4.2")) {
    std::printf("no SSE4.2 on this CPU: nothing to compare\n");
    return 0;
  }
  std::printf("%-9s %9s %10s %9s %8s %10s %9s %12s\n", "bytes", "memcpy", "one chain", "crc32c", "crc x",
              "part", "part us", "part/memcpy");
  std::printf("%-9s %9s %10s %9s %8s %10s\n", "", "GB/s", "GB/s", "GB/s", "", "GB/s");
  // The MLP's state per rank (2 MiB), the CNN's and GPT's shares (8, 32 MiB).
  for (size_t mib : {2, 8, 32}) {
    const size_t n = mib << 20;
    std::vector<unsigned char> src(n);
    uint32_t x = 12345;
    for (auto& b : src) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
    constexpr size_t at = strata::MemoryCheckpoints::kPayloadAt;  // a payload's place in its file
    std::vector<char> dst(n + at);
    uint32_t base = 0, crc = 0, part = 0;
    const double copy_ms = bench::best_ms(runs, [&] { std::memcpy(dst.data() + at, src.data(), n); });
    const double base_ms = bench::best_ms(runs, [&] { base = one_chain(src.data(), n); });
    const double crc_ms = bench::best_ms(runs, [&] { crc = strata::crc32c(src.data(), n); });
    const double part_ms = bench::best_ms(runs, [&] {
      strata::PartWriter w(dst.data() + at, n);
      w.put(src.data(), n);
      part = w.finish();
    });
    auto gbs = [n](double ms) { return double(n) / ms / 1e6; };
    std::printf("%-9zu %9.1f %10.1f %9.1f %7.2fx %10.1f %9.1f %11.2fx%s\n", n, gbs(copy_ms), gbs(base_ms),
                gbs(crc_ms), base_ms / crc_ms, gbs(part_ms), part_ms * 1e3, part_ms / copy_ms,
                base == crc && crc == part && std::memcmp(dst.data() + at, src.data(), n) == 0
                    ? "" : "   WRONG: the CRCs or the copy differ");
  }
}
