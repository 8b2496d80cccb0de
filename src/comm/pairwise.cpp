#include "comm/pairwise.h"

#include <algorithm>
#include <string>

#include "strata/error.h"

namespace strata {

namespace {

// Tags: the phase in the top bit of 15 (MPI guarantees tags up to 32767), the call's sequence
// number below it; thousands of calls apart before one repeats, never that many in flight.
int tag(bool gather, int64_t seq) { return (gather ? 0x4000 : 0) | int(seq & 0x3fff); }

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  STRATA_CHECK(false, "{} failed: {}", what, std::string(text, size_t(len)));
}

// With rank q, tag t: receive `in` floats into `into`, send `out` floats from `from` (nothing
// of a count of zero).
void exchange(std::vector<MPI_Request>& reqs, MPI_Comm comm, int q, int t, float* into, int in,
              const float* from, int out) {
  MPI_Request req;
  if (in > 0) {
    check(MPI_Irecv(into, in, MPI_FLOAT, q, t, comm, &req), "MPI_Irecv (pairwise sum)");
    reqs.push_back(req);
  }
  if (out > 0) {
    check(MPI_Isend(from, out, MPI_FLOAT, q, t, comm, &req), "MPI_Isend (pairwise sum)");
    reqs.push_back(req);
  }
}

}  // namespace

std::vector<MPI_Request> PairwiseSums::post_reduce_scatter(float* x, const std::vector<int>& counts,
                                                           const std::vector<int>& displs, int64_t seq,
                                                           std::vector<float>& staged) const {
  const int mine = counts[size_t(rank_)];
  if (staged.size() < size_t(mine) * size_t(size_ - 1)) staged.resize(size_t(mine) * size_t(size_ - 1));
  std::vector<MPI_Request> reqs;
  for (int q = 0, slot = 0; q < size_; ++q)
    if (q != rank_)
      exchange(reqs, comm_, q, tag(false, seq), staged.data() + size_t(slot++) * size_t(mine), mine,
               x + displs[size_t(q)], counts[size_t(q)]);
  return reqs;
}

void PairwiseSums::sum_shard(float* x, const std::vector<int>& counts, const std::vector<int>& displs,
                             const std::vector<float>& staged) const {
  const int64_t n = counts[size_t(rank_)];
  float* own = x + displs[size_t(rank_)];
  if (size_ < 2) return;
  // Rank q's part: its own shard (read before it is written) or its slot in staged.
  auto part = [&](int q) -> const float* {
    return q == rank_ ? own : staged.data() + int64_t(q < rank_ ? q : q - 1) * n;
  };
  // ((p0 + p1) + p2) + ...: in L1-sized blocks, the first pass two parts at once and the last
  // straight into the shard, so no block is copied as it is (acc = p0 and own = acc were two
  // more passes, compiled to rep movsq: a 1 MiB allreduce on 2 ranks took 147.5 us, now 128,
  // medians of 16 launches each).
  constexpr int64_t kBlock = 1024;
  float acc[kBlock];
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t m = std::min(kBlock, n - b0);
    const float *p0 = part(0) + b0, *p1 = part(1) + b0;
    float* first = size_ == 2 ? own + b0 : acc;
    for (int64_t j = 0; j < m; ++j) first[j] = p0[j] + p1[j];
    for (int q = 2; q < size_; ++q) {
      const float* p = part(q) + b0;
      float* out = q + 1 == size_ ? own + b0 : acc;
      for (int64_t j = 0; j < m; ++j) out[j] = acc[j] + p[j];
    }
  }
}

std::vector<MPI_Request> PairwiseSums::post_allgather(float* x, const std::vector<int>& counts,
                                                      const std::vector<int>& displs, int64_t seq) const {
  std::vector<MPI_Request> reqs;
  for (int q = 0; q < size_; ++q)
    if (q != rank_)
      exchange(reqs, comm_, q, tag(true, seq), x + displs[size_t(q)], counts[size_t(q)],
               x + displs[size_t(rank_)], counts[size_t(rank_)]);
  return reqs;
}

}  // namespace strata
