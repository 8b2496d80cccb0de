// Data parallelism: gradients averaged over replicas with a bucketed allreduce that starts
// while backward is still running (the way PyTorch DDP overlaps them).
//
// The model lays parameters out in reverse layer order, so the gradients backward has finished
// are always a prefix of the flat buffer. Buckets are consecutive ranges of whole parameters of
// about bucket_bytes; each is started (non-blocking) as soon as the finished prefix covers it.
// MPI progresses non-blocking collectives only inside MPI calls, so every later notification
// also tests the buckets in flight.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/comm.h"
#include "strata/model.h"

namespace strata {

struct AllreduceStats {
  double exposed_s = 0;  // training-thread time in allreduce calls: starting and testing
                         // buckets during backward, and waiting for them after it
  int64_t buckets = 0;
  int64_t bytes = 0;
};

class GradientAllreducer {
 public:
  GradientAllreducer(Comm& comm, const Model& model, float* grads, double bucket_bytes,
                     bool overlap);
  // Backward's notification that grads[0, ready) are final.
  void on_grads_ready(int64_t ready);
  // Starts whatever is left, waits for everything. After it, grads hold the sum over ranks.
  void finish();
  const AllreduceStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  int64_t num_buckets() const { return int64_t(bounds_.size()) - 1; }

 private:
  void start(size_t b);
  Comm& comm_;
  float* grads_;
  bool overlap_;
  std::vector<int64_t> bounds_;  // bucket b = [bounds_[b], bounds_[b+1])
  std::vector<int> handles_;
  size_t next_ = 0;  // first bucket not started
  AllreduceStats stats_;
};

}  // namespace strata
