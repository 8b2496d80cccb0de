// Sums over MPI ranks by point-to-point messages, one each way per pair of ranks, on a
// communicator of their own (MpiComm's start_reduce_scatter_sum and start_allreduce_sum).
// Open MPI's non-blocking collectives (libnbc) took twice the time of these on 2 ranks of a node
// for the buckets training sums (1 MiB: MPI_Iallreduce 250 us, this allreduce 148 us, Open
// MPI's blocking MPI_Allreduce 111-123 us, on 2 ranks of an AMD EPYC VM), and a reduce per
// owner doubled an MLP's exposed ZeRO-2 sums. Each shard's sum is formed in rank order (x_0 +
// x_1 + ...), whatever arrives first: deterministic, and on 2 ranks MPI's own x_0 + x_1.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace strata {

class PairwiseSums {
 public:
  // comm: a duplicate no other code sends on. Tags carry a per-call sequence number, so the
  // all-gathers that follow reduce-scatters as these complete (in any order) still match.
  PairwiseSums(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}

  // Posts the sends of the other ranks' shards and the receives of this rank's shard's parts
  // into staged (resized to (size - 1) x counts[rank]). counts/displs: floats, in rank order.
  std::vector<MPI_Request> post_reduce_scatter(float* x, const std::vector<int>& counts,
                                               const std::vector<int>& displs, int64_t seq,
                                               std::vector<float>& staged) const;
  // Once every request above is complete: this rank's shard = the parts' sum in rank order.
  void sum_shard(float* x, const std::vector<int>& counts, const std::vector<int>& displs,
                 const std::vector<float>& staged) const;
  // Posts the send of this rank's shard to every other rank and the receives of theirs, in place.
  std::vector<MPI_Request> post_allgather(float* x, const std::vector<int>& counts,
                                          const std::vector<int>& displs, int64_t seq) const;

 private:
  MPI_Comm comm_;
  int rank_, size_;
};

}  // namespace strata
