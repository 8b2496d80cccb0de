// MpiComm's pairwise sums on real ranks (mpirun -n 2, 3 or 4: each rank's own part first, last or
// between the others' in the sum). Reduce-scatter: each rank's shard is
// bitwise the sum x_0 + x_1 + ... in rank order (values whose sums round differently in other
// orders), for equal, unequal and empty shards; the other shards' inputs are left as they were.
// Allreduce (a reduce-scatter, then an all-gather started as the first completes): every element
// that sum on every rank, for sizes under, at and over one element per rank. Several buckets in
// flight at once, completed by test() polling, by wait() the last first, and by wait() in an order
// of each rank's own (rank 0 the last first, the others the first first: a rank's all-gather is
// posted when it sees its reduce-scatter complete, so a wait must move the other handles on, or
// the ranks wait for each other; SIGALRM after 60 s names a deadlock).
// Exit 0 when every case holds; 1 with a line per failure.
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <vector>

#include "strata/comm.h"

using namespace strata;

namespace {

// Rank q's input element i: fractions of very different sizes, so that the order of the sum shows.
// Every 101st element is -0 on every rank, whose sum is -0 (not +0: a sum started from zero
// would turn it), as MPI's x_0 + x_1 gives on 2 ranks.
float input(int q, int bucket, int64_t i) {
  if (i % 101 == 100) return -0.f;
  return float(std::ldexp(1.0 + 0.1 * double((i * 7 + q * 13 + bucket) % 97), (q * 11 + int(i)) % 24 - 12));
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

float serial_sum(int ranks, int bucket, int64_t i) {
  float s = input(0, bucket, i);
  for (int q = 1; q < ranks; ++q) s += input(q, bucket, i);
  return s;
}

enum class Order { kPoll, kWaitLastFirst, kWaitRankOwn };

// Completes handles[] by test() polling or by wait().
void complete(Comm& c, const std::vector<int>& handles, Order order) {
  if (order == Order::kWaitRankOwn && c.rank() != 0) {
    for (int h : handles) c.wait(h);
  } else if (order == Order::kPoll) {
    for (bool all = false; !all;) {
      all = true;
      for (size_t b = handles.size(); b-- > 0;) all = c.test(handles[b]) && all;
    }
  } else {
    for (size_t b = handles.size(); b-- > 0;) c.wait(handles[b]);
  }
}

int check_allreduce(Comm& c, const std::vector<int64_t>& sizes, Order order) {
  std::vector<std::vector<float>> x(sizes.size());
  std::vector<int> handles;
  for (size_t b = 0; b < sizes.size(); ++b) {
    for (int64_t i = 0; i < sizes[b]; ++i) x[b].push_back(input(c.rank(), int(b), i));
    handles.push_back(c.start_allreduce_sum(x[b].data(), sizes[b]));
  }
  complete(c, handles, order);
  int bad = 0;
  const char* how = order == Order::kPoll ? " polled" : order == Order::kWaitRankOwn ? " (waits in each rank's order)" : "";
  for (size_t b = 0; b < sizes.size(); ++b)
    for (int64_t i = 0; i < sizes[b]; ++i)
      if (const float want = serial_sum(c.size(), int(b), i); !same_bits(x[b][size_t(i)], want) && bad++ < 3)
        std::printf("FAIL: allreduce%s, rank %d, bucket %zu of %lld floats, element %lld: %.9g where %.9g\n",
                    how, c.rank(), b, (long long)sizes[b], (long long)i,
                    double(x[b][size_t(i)]), double(want));
  return bad;
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
  complete(c, handles, poll ? Order::kPoll : Order::kWaitLastFirst);
  int bad = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (int64_t i = at; i < at + buckets[b][size_t(q)]; ++i) {
        const float want = q == me ? serial_sum(n, int(b), i) : input(me, int(b), i);
        if (!same_bits(x[b][size_t(i)], want) && bad++ < 3)
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
  std::signal(SIGALRM, [](int) {
    static const char msg[] = "FAIL: no progress in 60 s: the ranks wait for each other (a deadlock)\n";
    if (::write(1, msg, sizeof msg - 1) < 0) {}
    std::_Exit(1);
  });
  ::alarm(60);
  mpi_init(&argc, &argv);
  int bad = 0;
  {
    auto world = make_world_comm();
    const int n = world->size();
    if (n < 2 || n > 4) {
      std::printf("FAIL: run on 2 to 4 ranks, not %d\n", n);
      mpi_finalize();
      return 1;
    }
    // Each bucket's shards: the first n of four.
    auto first_n = [n](std::vector<std::vector<int64_t>> v) {
      for (auto& b : v) b.resize(size_t(n));
      return v;
    };
    const auto equal = first_n({{1000, 1000, 1000, 1000}});
    const auto mixed = first_n({{5, 0, 3000, 7}, {0, 0, 17, 0}, {4096, 1, 0, 33}, {2500, 2500, 2499, 2501}});
    for (bool poll : {false, true}) {
      bad += check_case(*world, equal, poll, poll ? "equal shards, polled" : "equal shards, waited");
      bad += check_case(*world, mixed, poll, poll ? "four buckets in flight, polled" : "four buckets in flight, waited");
      bad += check_allreduce(*world, {2, 3, 1000, 4097, 1}, poll ? Order::kPoll : Order::kWaitLastFirst);
    }
    bad += check_allreduce(*world, {5000, 300000, 70000, 1 << 20}, Order::kWaitRankOwn);
    int64_t all = bad;
    world->allreduce_sum(&all, 1);
    if (world->rank() == 0 && all) std::printf("FAIL: %lld wrong elements in all\n", (long long)all);
    if (world->rank() == 0 && !all)
      std::printf("ok: reduce-scatter and allreduce on %d ranks: every sum in rank order, bitwise\n", n);
    bad = int(all);
  }
  mpi_finalize();
  return bad ? 1 : 0;
}
