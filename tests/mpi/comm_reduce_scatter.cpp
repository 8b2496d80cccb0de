// MpiComm's reduce-scatter on real ranks (mpirun -n 3): each rank's shard is bitwise the serial
// sum 0 + x_0 + x_1 + ... in rank order (values whose sums round differently in other orders),
// for equal, unequal and empty shards, with several buckets in flight at once, completed by
// test() polling and by wait() in either order; the other shards' inputs are left as they were.
// Exit 0 when every case holds; 1 with a line per failure.
#include <cmath>
#include <cstdio>
#include <vector>

#include "strata/comm.h"

using namespace strata;

namespace {

// Rank q's input element i: fractions of very different sizes, so that the order of the sum shows.
float input(int q, int bucket, int64_t i) {
  return float(std::ldexp(1.0 + 0.1 * double((i * 7 + q * 13 + bucket) % 97), (q * 11 + int(i)) % 24 - 12));
}

float serial_sum(int ranks, int bucket, int64_t i) {
  float s = 0.f;
  for (int q = 0; q < ranks; ++q) s += input(q, bucket, i);
  return s;
}

int check_case(Comm& c, const std::vector<std::vector<int64_t>>& buckets, bool poll, const char* name) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<float>> x(buckets.size());
  std::vector<int> handles;
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t total = 0;
    for (int64_t k : buckets[b]) total += k;
    for (int64_t i = 0; i < total; ++i) x[b].push_back(input(me, int(b), i));
    handles.push_back(c.start_reduce_scatter_sum(x[b].data(), buckets[b]));
  }
  if (poll) {  // test() until every bucket is done, the last first
    for (bool all = false; !all;) {
      all = true;
      for (size_t b = buckets.size(); b-- > 0;) all = c.test(handles[b]) && all;
    }
  } else {
    for (size_t b = buckets.size(); b-- > 0;) c.wait(handles[b]);
  }
  int bad = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (int64_t i = at; i < at + buckets[b][size_t(q)]; ++i) {
        const float want = q == me ? serial_sum(n, int(b), i) : input(me, int(b), i);
        if (x[b][size_t(i)] != want && bad++ < 3)
          std::printf("FAIL: %s, rank %d, bucket %zu, element %lld (shard of rank %d): %.9g where %.9g\n",
                      name, me, b, (long long)i, q, double(x[b][size_t(i)]), double(want));
      }
      at += buckets[b][size_t(q)];
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  mpi_init(&argc, &argv);
  int bad = 0;
  {
    auto world = make_world_comm();
    if (world->size() != 3) {
      std::printf("FAIL: run on 3 ranks, not %d\n", world->size());
      mpi_finalize();
      return 1;
    }
    const std::vector<std::vector<int64_t>> equal = {{1000, 1000, 1000}};
    const std::vector<std::vector<int64_t>> mixed = {{5, 0, 3000}, {0, 0, 17}, {4096, 1, 0}, {2500, 2500, 2499}};
    for (bool poll : {false, true}) {
      bad += check_case(*world, equal, poll, poll ? "equal shards, polled" : "equal shards, waited");
      bad += check_case(*world, mixed, poll, poll ? "four buckets in flight, polled" : "four buckets in flight, waited");
    }
    int64_t all = bad;
    world->allreduce_sum(&all, 1);
    if (world->rank() == 0 && all) std::printf("FAIL: %lld wrong elements in all\n", (long long)all);
    if (world->rank() == 0 && !all) std::printf("ok: reduce-scatter on 3 ranks: every shard the serial sum, bitwise\n");
    bad = int(all);
  }
  mpi_finalize();
  return bad ? 1 : 0;
}
