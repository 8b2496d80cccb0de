// Data parallelism: gradients averaged over replicas with a bucketed allreduce that starts
// while backward is still running (the way PyTorch DDP overlaps them).
//
// The model lays parameters out in reverse layer order, so the gradients backward has finished
// are always a prefix of the flat buffer. Buckets are consecutive ranges of whole parameters of
// about bucket_bytes; each is started (non-blocking) as soon as the finished prefix covers it.
// A bucket's sum moves on only inside test or wait on its Comm (MPI's progress; the pairwise
// sums' second phase), so every later notification also tests the buckets in flight.
//
// With ZeRO-2 (zero.h) each bucket is reduce-scattered instead: the bucket's part of each
// replica's shard goes to that replica (a bucket may span several shards, a shard several
// buckets).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/traffic_gate.h"
#include "model/model.h"
#include "strata/comm.h"

namespace strata {

struct AllreduceStats {
  double exposed_s = 0;  // training-thread time in allreduce calls: starting and testing
                         // buckets during backward, and waiting for them after it (with
                         // ZeRO, also the reduce-scatters and the parameter all-gather)
  int64_t buckets = 0;
  int64_t bytes = 0;
};

// The buckets over a flat gradient buffer whose tensors end at `ends` (floats, ascending):
// bounds from 0, each bucket closed at the first tensor end at least `cap` floats past its
// start (the first at cap / 8: as in PyTorch DDP it closes as soon as the last layers'
// gradients exist, so its sum overlaps the rest of backward instead of waiting for a full
// bucket), the last at ends.back(). The step-time model (plan/step_time.cpp) cuts its buckets
// with this too.
std::vector<int64_t> bucket_bounds(const std::vector<int64_t>& ends, int64_t cap);

class GradientAllreducer {
 public:
  // shards: ZeRO-2's shard sizes, one per rank of comm (zero_counts); null: allreduce.
  // grads: the model's gradient buffer, read at each bucket (memory checkpoints move it).
  GradientAllreducer(Comm& comm, const Model& model, Tensor& grads, double bucket_bytes,
                     bool overlap, const std::vector<int64_t>* shards = nullptr);
  // With shards: buckets overlapping grads[begin, end) are all-reduced all the same (ZeRO-2 in a
  // pipeline: the token table's sum over replicas is then added to its other copy's, on the
  // other end of the pipeline, as without ZeRO: the same arithmetic).
  void allreduce_whole(int64_t begin, int64_t end) { whole_begin_ = begin, whole_end_ = end; }
  // Backward's notification that grads[0, ready) are final.
  void on_grads_ready(int64_t ready);
  // Starts whatever is left, waits for everything. After it, grads hold the sum over ranks
  // (with shards: this rank's shard does).
  void finish();
  const AllreduceStats& stats() const { return stats_; }
  // Other data-parallel communication on the training thread (ZeRO's parameter all-gather).
  void count_exposed(double seconds) { stats_.exposed_s += seconds; }
  void reset_stats() { stats_ = {}; }
  // Closed from a step's first bucket until finish(): background traffic (the memory
  // checkpoints' exchange) posts nothing new while the sums are in flight.
  void set_gate(TrafficGate* g) { gate_ = g; }
  TrafficGate* gate() const { return gate_; }  // (ZeRO's all-gather closes it too)
  int64_t num_buckets() const { return int64_t(bounds_.size()) - 1; }
  bool scatters() const { return scatters_; }  // ZeRO-2

 private:
  void start(size_t b);
  // Whether the buckets go through the comm: over several ranks, or one whose device
  // communicator runs its collectives alone (Comm::sums_alone).
  bool sums() const { return comm_.size() > 1 || comm_.sums_alone(); }
  bool whole(size_t b) const { return bounds_[b + 1] > whole_begin_ && bounds_[b] < whole_end_; }
  Comm& comm_;
  Tensor& grads_;
  bool overlap_;
  std::vector<int64_t> bounds_;  // bucket b = [bounds_[b], bounds_[b+1])
  bool scatters_;
  std::vector<std::vector<int64_t>> scatter_;  // ZeRO-2: bucket b's part of each rank's shard
  int64_t whole_begin_ = 0, whole_end_ = 0;
  std::vector<int> handles_;
  size_t next_ = 0;  // first bucket not started
  TrafficGate* gate_ = nullptr;
  bool closed_ = false;  // this step's sums hold the gate closed
  AllreduceStats stats_;
};

}  // namespace strata
