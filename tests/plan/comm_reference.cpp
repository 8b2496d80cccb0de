// The reference `strata bench comm` is compared with (tests/plan/bench_comm_reference.py):
// the same measurements written directly on MPI's API, nothing of strata's. Debian packages
// neither the OSU micro-benchmarks nor IMB, so this is the plain loop they run.
//
//   mpirun -n 2 comm_reference MIN_BYTES MAX_BYTES ITERS WARMUP
//
// For each power of 2 from MIN to MAX, prints "allreduce BYTES SECONDS", "iallreduce BYTES
// SECONDS", "pairwise BYTES SECONDS" and "sendrecv BYTES SECONDS" on rank 0: allreduce:
// MPI_Barrier, then one in-place MPI_Allreduce of BYTES/4 floats, timed on every rank; an
// iteration's time is the slowest rank's, the figure the median over ITERS (after WARMUP
// untimed). iallreduce: the same with MPI_Iallreduce + MPI_Wait. pairwise: the same sum as
// point-to-point messages, the way strata's gradient buckets are summed: each rank sends every
// other rank its shard of the buffer (shards of ceil(n / ranks) floats rounded up to 16) and
// receives theirs of its own (MPI_Isend, MPI_Irecv, MPI_Waitall), adds them in rank order, then
// sends its summed shard to every rank and receives theirs in place. sendrecv: rank i sends BYTES to rank i + n/2 with MPI_Send and
// receives them back (MPI_Recv); half the round trip, on rank i (osu_latency's definition);
// median over ITERS of the slowest pair.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// blocking: MPI_Allreduce; else MPI_Iallreduce and MPI_Wait (the call strata's Comm makes for
// the gradients' buckets, start_allreduce_sum).
double allreduce_time(std::vector<float>& x, int n, int iters, int warmup, bool blocking) {
  std::vector<double> t(size_t(iters), 0.0);
  for (int it = 0; it < warmup + iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (blocking) {
      MPI_Allreduce(MPI_IN_PLACE, x.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, x.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    if (it >= warmup) t[size_t(it - warmup)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return median(t);
}

// The pairwise allreduce described above, on MPI_COMM_WORLD; staged and acc are scratch.
void pairwise_allreduce(std::vector<float>& x, std::vector<float>& staged, std::vector<float>& acc,
                        int n, int rank, int size) {
  const int per = ((n + size - 1) / size + 15) / 16 * 16;
  auto count = [&](int r) { return std::max(0, std::min(per, n - r * per)); };
  const int mine = count(rank);
  staged.resize(size_t(mine) * size_t(size - 1));
  std::vector<MPI_Request> reqs;
  for (int q = 0, slot = 0; q < size; ++q) {
    if (q == rank) continue;
    MPI_Request r;
    if (mine > 0) {
      MPI_Irecv(staged.data() + size_t(slot) * size_t(mine), mine, MPI_FLOAT, q, 1, MPI_COMM_WORLD, &r);
      reqs.push_back(r);
    }
    if (count(q) > 0) {
      MPI_Isend(x.data() + size_t(q) * size_t(per), count(q), MPI_FLOAT, q, 1, MPI_COMM_WORLD, &r);
      reqs.push_back(r);
    }
    ++slot;
  }
  MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  float* own = x.data() + size_t(rank) * size_t(per);
  acc.resize(1024);
  for (int b0 = 0; b0 < mine; b0 += 1024) {  // in blocks that stay in L1
    const int m = std::min(1024, mine - b0);
    for (int q = 0, slot = 0; q < size; ++q) {
      const float* part = (q == rank ? own : staged.data() + size_t(slot++) * size_t(mine)) + b0;
      if (q == 0)
        std::copy(part, part + m, acc.begin());
      else
        for (int i = 0; i < m; ++i) acc[size_t(i)] += part[i];
    }
    std::copy(acc.begin(), acc.begin() + m, own + b0);
  }
  reqs.clear();
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    MPI_Request r;
    if (count(q) > 0) {
      MPI_Irecv(x.data() + size_t(q) * size_t(per), count(q), MPI_FLOAT, q, 2, MPI_COMM_WORLD, &r);
      reqs.push_back(r);
    }
    if (mine > 0) {
      MPI_Isend(own, mine, MPI_FLOAT, q, 2, MPI_COMM_WORLD, &r);
      reqs.push_back(r);
    }
  }
  MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
}

double pairwise_time(std::vector<float>& x, int n, int iters, int warmup, int rank, int size) {
  std::vector<float> staged, acc;
  std::vector<double> t(size_t(iters), 0.0);
  for (int it = 0; it < warmup + iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    pairwise_allreduce(x, staged, acc, n, rank, size);
    if (it >= warmup) t[size_t(it - warmup)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return median(t);
}

double pingpong_time(std::vector<float>& x, std::vector<float>& y, int n, int iters, int warmup,
                     int rank, int size) {
  const int half = size / 2;
  const int peer = rank < half ? rank + half : rank < 2 * half ? rank - half : -1;
  std::vector<double> t(size_t(iters), 0.0);
  for (int it = 0; it < warmup + iters && peer >= 0; ++it) {
    double dt = 0;
    if (rank < peer) {
      const double t0 = MPI_Wtime();
      MPI_Send(x.data(), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
      MPI_Recv(y.data(), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      dt = (MPI_Wtime() - t0) / 2;
    } else {
      MPI_Recv(y.data(), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(x.data(), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
    }
    if (it >= warmup) t[size_t(it - warmup)] = dt;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  // The thread level strata asks for (its memory checkpoints' exchange thread): Open MPI picks
  // its transports by it, and at MPI_Init's single level a 64 KiB allreduce here was 17-25 %
  // slower than strata's, steadily.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 5 || size < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: mpirun -n 2 comm_reference MIN MAX ITERS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  const long long lo = std::atoll(argv[1]), hi = std::atoll(argv[2]);
  const int iters = std::atoi(argv[3]), warmup = std::atoi(argv[4]);
  std::vector<float> x(size_t(hi / 4), 1.0f), y(size_t(hi / 4), 0.0f);
  for (long long bytes = lo; bytes <= hi; bytes *= 2) {
    const int n = int(bytes / 4);
    const double a = allreduce_time(x, n, iters, warmup, true);
    const double i = allreduce_time(x, n, iters, warmup, false);
    const double w = pairwise_time(x, n, iters, warmup, rank, size);
    const double p = pingpong_time(x, y, n, iters, warmup, rank, size);
    if (rank == 0)
      std::printf("allreduce %lld %.9g\niallreduce %lld %.9g\npairwise %lld %.9g\nsendrecv %lld %.9g\n",
                  bytes, a, bytes, i, bytes, w, bytes, p);
  }
  MPI_Finalize();
  return 0;
}
