// A communication profile: the measured times of the collectives strata uses, per op, level
// (intra: ranks of one node; inter: one rank per node) and size, and the latency + bandwidth
// fit `strata plan` predicts from. Written by `strata bench comm` as JSON (the contract in
// docs/planning.md, "Measuring the machine").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata {

// allreduce: the non-blocking sum the gradients' buckets use (Comm::start_allreduce_sum, then
// wait; on MPI strata's pairwise sum, comm/pairwise.h); allreduce_blocking: the blocking
// Comm::allreduce_sum (MPI_Allreduce on MPI), measured on request.
enum class CommOp { allreduce, reduce_scatter, all_gather, sendrecv, allreduce_blocking };
// "allreduce", "reduce_scatter", "all_gather", "sendrecv", "allreduce_blocking"
const char* comm_op_name(CommOp op);
// The op named `name` (UserError, exit 2, naming `flag` and the ops, otherwise).
CommOp parse_comm_op(const std::string& name, const std::string& flag);

// nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md of NVIDIA/nccl-tests): busbw = algbw x
// factor, algbw = bytes / time, with bytes the whole buffer (for reduce-scatter and
// all-gather, all n shards): allreduce 2(n-1)/n (n-1 additions and n copies per element, over
// n links), reduce-scatter and all-gather (n-1)/n (one of those halves), send/receive 1;
// allreduce_blocking as allreduce.
double busbw_factor(CommOp op, int ranks);

// "8", "64K", "1M", "1G" (binary: K = 1024): bytes. UserError (exit 2) naming `flag` for
// anything else, zero or a size over 4 GiB.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

struct CommMeasurement {
  CommOp op;
  std::string level;  // "intra" | "inter"
  int ranks = 0;      // the communicator's size (for sendrecv: 2, one pair)
  int64_t bytes = 0;
  double time_s = 0;  // median over iterations of the slowest rank's time
  double algbw_Bps() const { return time_s > 0 ? double(bytes) / time_s : 0; }
  double busbw_Bps() const { return algbw_Bps() * busbw_factor(op, ranks); }
};

// time(op, bytes, ranks) ~= latency_s + bytes x busbw_factor(op, ranks) / busbw_Bps.
struct CommFit {
  double latency_s = 0, busbw_Bps = 0;
};
// The fit of one op at one level from its measurements (sizes ascending): latency_s is the
// median time of the sizes up to 4 KiB (the smallest size measured if none is that small),
// where the bytes' share of the time is small; busbw_Bps the median busbw of the sizes from
// 1 MiB (the largest size if none is that large), where the latency's share is small. nullopt
// when there are none.
std::optional<CommFit> fit_comm(const std::vector<CommMeasurement>& m, CommOp op,
                                const std::string& level);
// The fit's prediction for a message of `bytes` over `ranks` ranks (one latency: the
// algorithm's steps are not modelled).
double predicted_time_s(const CommFit& f, CommOp op, int64_t bytes, int ranks);

struct CommProfile {
  std::string date, host, strata_version, backend = "mpi", device = "cpu";
  int ranks = 1, nodes = 1, ranks_per_node = 1;
  int iters = 0, warmup = 0, rounds = 1;
  std::vector<CommMeasurement> measurements;
};

// The JSON document (strata_comm_profile 1) with the fits of every op and level measured.
std::string comm_profile_json(const CommProfile& p);
// The table's header and one row (op, bytes, time_us, algbw GB/s, busbw GB/s, level).
std::string comm_table_header();
std::string comm_table_row(const CommMeasurement& m);
// bench-comm-<host>-<YYYYMMDD-HHMMSS>.json
std::string default_comm_profile_name(const std::string& host);

}  // namespace strata
