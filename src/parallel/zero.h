// ZeRO (parallel.zero; DeepSpeed's stages 1 and 2, llm.c's ZeRO-1): a stage's D replicas (its
// stage_comm; with tensor parallelism, per tensor part) split the stage's flat parameter buffer
// into D contiguous shards, replica r owning shard r. Each keeps the optimizer state of its
// shard only and updates that shard; the updated parameters are then all-gathered.
//   zero = 1: gradients are all-reduced as without ZeRO (bucketed, overlapping backward), so
//             every rank has the whole sum; only the optimizer state is 1/D.
//   zero = 2: each bucket is reduce-scattered as soon as backward has produced it: a rank
//             receives only its shard's sum (half an allreduce's traffic).
// Checkpoints keep the unsharded layout (whole tensors by global name): the shards are
// gathered onto replica 0 of each stage before the write, and a resume loads the whole state
// and keeps this rank's shard, so any grid, with or without ZeRO, continues from any other.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/traffic_gate.h"
#include "model/model.h"
#include "model/optim.h"
#include "parallel/grid.h"
#include "strata/comm.h"

namespace strata {

// A stage model's shards of its flat buffers: cache_line_shards (strata/comm.h) of its packed
// layout over the replicas, each shard
// boundary moved to where that packed index lies in the padded flat buffers (the padding
// after a tensor goes with it), so the shards hold the same tensors' elements whatever the
// padding.
std::vector<int64_t> zero_counts(const Model& model, int replicas);
OptimShard zero_shard(const std::vector<int64_t>& counts, int replica);
// Each shard's part of the flat range [begin, end): contiguous, in replica order, summing to
// end - begin (a bucket's reduce-scatter, a piece of the all-gather).
std::vector<int64_t> shard_parts(const std::vector<int64_t>& counts, int64_t begin, int64_t end);

// Collective over `world` (host memory): replica 0 of each stage and tensor part receives the
// other replicas' shards of `opt`'s state (their sizes `counts`, zero_counts) and returns the
// unsharded state (every other rank gets null). `opt` must be pulled to the host first.
std::unique_ptr<Optimizer> gather_shards(Comm& world, const ProcessGrid& grid, Optimizer& opt,
                                         const std::vector<int64_t>& counts);
// This rank's shard of an unsharded state (after a resume), and its step count.
void take_shard(Optimizer& whole, Optimizer& opt);

// After each replica has updated its shard of `values` (backend memory): every shard from its
// owner, over the stage's replicas, in pieces of at most 2^28 floats (one MPI call's counts
// are ints); `gate` closed meanwhile (background traffic waits: comm/traffic_gate.h).
void allgather_shards(Comm& stage_comm, float* values, const std::vector<int64_t>& counts,
                      TrafficGate* gate = nullptr);

}  // namespace strata
