// The communication model a step-time prediction uses: seconds for one collective or
// point-to-point transfer of a given size over a given number of ranks, within a node
// (intra) or across nodes (inter). From either
//   a comm profile (`strata bench comm`'s JSON: measured points and a latency/bandwidth fit
//     per op and level), or
//   a cluster description (TOML, docs/planning.md "Cluster descriptions": published link
//     figures, for projections to machines not at hand).
// Times follow nccl-tests' bus bandwidth: t = latency + bytes * factor / busbw with factor
// 2(n-1)/n for allreduce, (n-1)/n for reduce-scatter and all-gather (bytes: the whole
// buffer), 1 for sendrecv.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/comm_profile.h"

namespace strata {

// The ops (CommOp, comm_op_name, busbw_factor) are comm_profile.h's, what bench comm writes.
enum class CommLevel { kIntra, kInter };
const char* comm_level_name(CommLevel level);  // "intra", "inter"

struct LinkFit {
  double latency_s = 0, busbw_Bps = 0;  // busbw 0: no figure
};

// A device for projections without a measured layer profile (a cluster file's [device]).
struct ClusterDevice {
  std::string name;
  double peak_tflops_bf16 = 0, peak_tflops_fp32 = 0, memory_GB = 0;
  double achieved_fraction = 0.4;  // of peak, assumed for the layers' FLOPs
  bool present = false;
};

// Whether `path` names a cluster description (TOML, the suffix in any case) rather than a comm
// profile (JSON).
bool is_cluster_file(const std::string& path);

class CommModel {
 public:
  // No communication at all (one rank): every question answers 0.
  CommModel() = default;
  // Throw UserError(kExitBadInput) naming the file and the key at fault.
  static CommModel from_profile(const std::string& path);
  static CommModel from_profile_text(const std::string& text, const std::string& where);
  static CommModel from_cluster(const std::string& path);
  static CommModel from_cluster_text(const std::string& text, const std::string& where);

  // One op over `ranks` ranks all at `level`. Prefers the measured points (interpolated in
  // log size, at the measured rank count nearest `ranks`) where `bytes` lies within them,
  // else the fit. ranks <= 1 or bytes <= 0: 0.
  double seconds(CommOp op, double bytes, int ranks, CommLevel level) const;
  // The op over `ranks` ranks placed `ranks_per_node` to a node: within one node when they fit
  // (ranks <= ranks_per_node), else hierarchical on a fat tree (allreduce: intra
  // reduce-scatter, inter allreduce of 1/r of the bytes among the r node-groups in parallel,
  // intra all-gather); on a rail-optimised fabric the same, since each local rank has its own
  // rail (the inter stage runs r rails at once, no sharing of one NIC).
  double collective_seconds(CommOp op, double bytes, int ranks, int ranks_per_node) const;

  bool empty() const { return fits_.empty() && points_.empty(); }
  const std::string& source() const { return source_; }  // "measured PATH" | "cluster PATH" | "none"
  const std::string& topology() const { return topology_; }
  int ranks_per_node() const { return ranks_per_node_; }
  const ClusterDevice& device() const { return device_; }
  // What the figures rest on, one line each, for the planner to print.
  const std::vector<std::string>& assumptions() const { return assumptions_; }
  LinkFit fit(CommOp op, CommLevel level) const;

  struct Point {
    CommOp op;
    CommLevel level;
    int ranks;
    double bytes, time_s;
  };

 private:
  double from_points(CommOp op, double bytes, int ranks, CommLevel level, bool* found) const;
  std::map<std::pair<int, int>, LinkFit> fits_;  // (op, level)
  std::vector<Point> points_;
  std::string source_ = "none", topology_ = "fat-tree";
  int ranks_per_node_ = 1;
  ClusterDevice device_;
  std::vector<std::string> assumptions_;
};

}  // namespace strata
