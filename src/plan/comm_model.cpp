#include "plan/comm_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "base/files.h"
#include "base/json.h"
#include "strata/error.h"

namespace strata {

bool is_cluster_file(const std::string& path) {
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.ends_with(".toml");
}
namespace {

constexpr CommOp kOps[] = {CommOp::allreduce, CommOp::reduce_scatter, CommOp::all_gather,
                           CommOp::sendrecv};
constexpr CommLevel kLevels[] = {CommLevel::kIntra, CommLevel::kInter};

std::pair<int, int> key(CommOp op, CommLevel level) { return {int(op), int(level)}; }

// ---- the comm profile's JSON ------------------------------------------------------------

const JsonValue& member(const JsonValue& o, const std::string& k, const std::string& where,
                        const std::string& path) {
  const JsonValue* v = o.is_object() ? o.find(k) : nullptr;
  if (!v) fail_input("{}: key \"{}\" missing", where, path.empty() ? k : path + "." + k);
  return *v;
}

double number(const JsonValue& v, const std::string& where, const std::string& path, double lo) {
  if (v.kind != JsonValue::Kind::kNumber || !(v.number >= lo) || !std::isfinite(v.number))
    fail_input("{}: key \"{}\" must be a number >= {}", where, path, lo);
  return v.number;
}

CommOp op_named(const std::string& s, const std::string& where, const std::string& path) {
  for (CommOp op : kOps)
    if (s == comm_op_name(op)) return op;
  fail_input("{}: key \"{}\": unknown op \"{}\" (allreduce, reduce_scatter, all_gather, sendrecv)",
             where, path, s);
}

CommLevel level_named(const std::string& s, const std::string& where, const std::string& path) {
  if (s == "intra") return CommLevel::kIntra;
  if (s == "inter") return CommLevel::kInter;
  fail_input("{}: key \"{}\": unknown level \"{}\" (intra, inter)", where, path, s);
}

// ---- the cluster description's TOML ---------------------------------------------------------

struct TomlReader {
  const toml::table& root;
  std::string where;
  std::string at(const toml::node& n) const {
    const auto& b = n.source().begin;
    return b.line ? fmt::format("{}:{}:{}", where, b.line, b.column) : where;
  }
  const toml::node& need(const toml::table& t, const std::string& k, const std::string& path) const {
    const toml::node* n = t.get(k);
    if (!n) fail_input("{}: key \"{}\" missing", where, path);
    return *n;
  }
  // A positive number up to `most` (a figure beyond it is a typo, not hardware).
  double positive(const toml::table& t, const std::string& k, const std::string& path,
                  double most = 1e9) const {
    const toml::node& n = need(t, k, path);
    const auto v = n.value<double>();
    if (!(n.is_number() && v && *v > 0 && *v <= most))
      fail_input("{}: key \"{}\" must be a positive number up to {:g}", at(n), path, most);
    return *v;
  }
  std::string text(const toml::table& t, const std::string& k, const std::string& path) const {
    const toml::node& n = need(t, k, path);
    if (!n.is_string()) fail_input("{}: key \"{}\" must be a string", at(n), path);
    return *n.value<std::string>();
  }
  const toml::table& table(const std::string& k) const {
    const toml::node& n = need(root, k, k);
    if (!n.is_table()) fail_input("{}: \"{}\" must be a table ([{}])", at(n), k, k);
    return *n.as_table();
  }
  void only(const toml::table& t, std::initializer_list<const char*> keys, const std::string& in) const {
    for (auto&& [k, v] : t) {
      const std::string name(k.str());
      if (std::none_of(keys.begin(), keys.end(), [&](const char* x) { return name == x; }))
        fail_input("{}: unknown key \"{}{}\"", at(v), in.empty() ? "" : in + ".", name);
    }
  }
};

}  // namespace

const char* comm_level_name(CommLevel level) { return level == CommLevel::kIntra ? "intra" : "inter"; }

CommModel CommModel::from_profile(const std::string& path) {
  return from_profile_text(read_whole_file(path), path);
}

CommModel CommModel::from_profile_text(const std::string& text, const std::string& where) {
  const JsonValue root = parse_json(text, where);
  if (!root.is_object()) fail_input("{}: not a comm profile (expected a JSON object)", where);
  const JsonValue& version = member(root, "strata_comm_profile", where, "");
  if (!version.is_int() || version.int_value != 1)
    fail_input("{}: key \"strata_comm_profile\": version {} is not one this strata reads (1)", where,
               version.kind == JsonValue::Kind::kNumber ? fmt::format("{}", version.number) : "?");
  CommModel m;
  m.source_ = "measured " + where;
  if (const JsonValue* r = root.find("ranks_per_node"))
    m.ranks_per_node_ = int(number(*r, where, "ranks_per_node", 1));
  const std::string backend =
      root.find("backend") && root.find("backend")->is_string() ? root.find("backend")->text : "mpi";
  const JsonValue& fit = member(root, "fit", where, "");
  if (!fit.is_object()) fail_input("{}: key \"fit\" must be an object", where);
  for (const auto& [opname, levels] : fit.members) {
    const CommOp op = op_named(opname, where, "fit." + opname);
    if (!levels.is_object()) fail_input("{}: key \"fit.{}\" must be an object", where, opname);
    for (const auto& [lname, f] : levels.members) {
      const std::string path = fmt::format("fit.{}.{}", opname, lname);
      const CommLevel level = level_named(lname, where, path);
      LinkFit lf;
      lf.latency_s = number(member(f, "latency_s", where, path), where, path + ".latency_s", 0);
      lf.busbw_Bps = number(member(f, "busbw_Bps", where, path), where, path + ".busbw_Bps", 0);
      if (lf.busbw_Bps <= 0) fail_input("{}: key \"{}.busbw_Bps\" must be positive", where, path);
      m.fits_[key(op, level)] = lf;
    }
  }
  if (const JsonValue* ms = root.find("measurements")) {
    if (!ms->is_array()) fail_input("{}: key \"measurements\" must be an array", where);
    for (size_t i = 0; i < ms->items.size(); ++i) {
      const JsonValue& p = ms->items[i];
      const std::string path = fmt::format("measurements[{}]", i);
      const JsonValue& op = member(p, "op", where, path), &level = member(p, "level", where, path);
      if (!op.is_string() || !level.is_string())
        fail_input("{}: key \"{}\": op and level must be strings", where, path);
      m.points_.push_back({op_named(op.text, where, path + ".op"),
                           level_named(level.text, where, path + ".level"),
                           int(number(member(p, "ranks", where, path), where, path + ".ranks", 1)),
                           number(member(p, "bytes", where, path), where, path + ".bytes", 0),
                           number(member(p, "time_s", where, path), where, path + ".time_s", 0)});
    }
  }
  if (m.fits_.empty() && m.points_.empty()) fail_input("{}: key \"fit\" holds no op", where);
  m.assumptions_.push_back(fmt::format("communication: measured by strata bench comm ({}, {})", backend, where));
  const bool inter = std::any_of(m.fits_.begin(), m.fits_.end(), [](const auto& f) {
    return f.first.second == int(CommLevel::kInter);
  });
  if (!inter)
    m.assumptions_.push_back("communication: no inter-node figures in the profile; the intra-node "
                             "ones stand in for them (optimistic across nodes)");
  return m;
}

CommModel CommModel::from_cluster(const std::string& path) {
  return from_cluster_text(read_whole_file(path), path);
}

CommModel CommModel::from_cluster_text(const std::string& text, const std::string& where) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail_input("{}:{}:{}: not valid TOML: {}", where, e.source().begin.line, e.source().begin.column, what);
  }
  const TomlReader r{root, where};
  r.only(root, {"name", "ranks_per_node", "topology", "intra", "inter", "device"}, "");
  CommModel m;
  m.source_ = "cluster " + where;
  const std::string name = r.text(root, "name", "name");
  const toml::node& rpn = r.need(root, "ranks_per_node", "ranks_per_node");
  if (!rpn.is_integer() || *rpn.value<int64_t>() < 1 || *rpn.value<int64_t>() > 1024)
    fail_input("{}: key \"ranks_per_node\" must be an integer from 1 to 1024", r.at(rpn));
  m.ranks_per_node_ = int(*rpn.value<int64_t>());
  m.topology_ = r.text(root, "topology", "topology");
  if (m.topology_ != "fat-tree" && m.topology_ != "rail-optimised")
    fail_input("{}: key \"topology\" must be \"fat-tree\" or \"rail-optimised\", not \"{}\"",
               r.at(*root.get("topology")), m.topology_);
  for (CommLevel level : kLevels) {
    const std::string lname = comm_level_name(level);
    const toml::table& t = r.table(lname);
    r.only(t, {"bandwidth_GBps", "latency_us"}, lname);
    const LinkFit lf{.latency_s = r.positive(t, "latency_us", lname + ".latency_us") * 1e-6,
                     .busbw_Bps = r.positive(t, "bandwidth_GBps", lname + ".bandwidth_GBps") * 1e9};
    for (CommOp op : kOps) m.fits_[key(op, level)] = lf;
    m.assumptions_.push_back(fmt::format(
        "communication ({}, {}): {} {:.0f} GB/s per rank per direction as bus bandwidth, {:.1f} us "
        "per step (log2 n steps per collective)", name, where, lname, lf.busbw_Bps / 1e9, lf.latency_s * 1e6));
  }
  if (const toml::node* d = root.get("device")) {
    if (!d->is_table()) fail_input("{}: \"device\" must be a table ([device])", r.at(*d));
    const toml::table& t = *d->as_table();
    r.only(t, {"name", "peak_tflops_bf16", "peak_tflops_fp32", "memory_GB", "achieved_fraction"}, "device");
    ClusterDevice& dv = m.device_;
    dv.present = true;
    dv.name = r.text(t, "name", "device.name");
    dv.peak_tflops_bf16 = r.positive(t, "peak_tflops_bf16", "device.peak_tflops_bf16");
    dv.peak_tflops_fp32 = r.positive(t, "peak_tflops_fp32", "device.peak_tflops_fp32");
    dv.memory_GB = r.positive(t, "memory_GB", "device.memory_GB", 1e6);
    if (t.get("achieved_fraction")) {
      dv.achieved_fraction = r.positive(t, "achieved_fraction", "device.achieved_fraction");
      if (dv.achieved_fraction > 1)
        fail_input("{}: key \"device.achieved_fraction\" must be at most 1", r.at(*t.get("achieved_fraction")));
    }
    m.assumptions_.push_back(fmt::format(
        "device {}: {:.0f} TFLOP/s bf16, {:.0f} fp32 peak, {:.0f} GB; layers run at {:.0f} % of peak "
        "(assumed, no measured profile)", dv.name, dv.peak_tflops_bf16, dv.peak_tflops_fp32,
        dv.memory_GB, dv.achieved_fraction * 100));
  }
  m.assumptions_.push_back(fmt::format("topology {}: collectives across nodes run hierarchically "
                                       "(intra reduce-scatter, inter allreduce, intra all-gather)",
                                       m.topology_));
  return m;
}

LinkFit CommModel::fit(CommOp op, CommLevel level) const {
  auto it = fits_.find(key(op, level));
  if (it != fits_.end()) return it->second;
  // An op not measured at this level: allreduce's link figures stand in; then the other level.
  it = fits_.find(key(CommOp::allreduce, level));
  if (it != fits_.end()) return it->second;
  const CommLevel other = level == CommLevel::kIntra ? CommLevel::kInter : CommLevel::kIntra;
  it = fits_.find(key(op, other));
  if (it != fits_.end()) return it->second;
  it = fits_.find(key(CommOp::allreduce, other));
  return it != fits_.end() ? it->second : LinkFit{};
}

double CommModel::from_points(CommOp op, double bytes, int ranks, CommLevel level, bool* found) const {
  // The measured sizes of this op, level and rank count, ascending.
  std::vector<std::pair<double, double>> xs;
  for (const Point& p : points_)
    if (p.op == op && p.level == level && p.ranks == ranks) xs.push_back({p.bytes, p.time_s});
  std::sort(xs.begin(), xs.end());
  *found = false;
  if (xs.empty() || bytes < xs.front().first || bytes > xs.back().first) return 0;
  *found = true;
  auto hi = std::lower_bound(xs.begin(), xs.end(), std::make_pair(bytes, -1.0));
  if (hi->first == bytes || hi == xs.begin()) return hi->second;
  auto lo = hi - 1;
  const double f = (bytes - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

double CommModel::seconds(CommOp op, double bytes, int ranks, CommLevel level) const {
  if (ranks <= 1 || bytes <= 0 || empty()) return 0;
  bool found = false;
  const double measured = from_points(op, bytes, ranks, level, &found);
  if (found) return measured;
  const LinkFit f = fit(op, level);
  if (f.busbw_Bps <= 0) return 0;
  // A cluster file's latency is one link's: a collective takes log2 n steps of it (tree or
  // recursive halving for the small messages latency matters for). A measured fit's is already
  // the collective's.
  const bool per_step = source_.rfind("cluster", 0) == 0 && op != CommOp::sendrecv;
  const double latency = per_step ? f.latency_s * std::ceil(std::log2(double(ranks))) : f.latency_s;
  return latency + bytes * busbw_factor(op, ranks) / f.busbw_Bps;
}

double CommModel::collective_seconds(CommOp op, double bytes, int ranks, int ranks_per_node) const {
  if (ranks <= 1) return 0;
  const int r = std::max(1, ranks_per_node);
  if (ranks <= r) return seconds(op, bytes, ranks, CommLevel::kIntra);
  const int nodes = (ranks + r - 1) / r;
  if (op == CommOp::sendrecv) return seconds(op, bytes, 2, CommLevel::kInter);
  // Hierarchical: the r local ranks each own 1/r of the buffer after an intra reduce-scatter,
  // and r inter-node collectives of bytes / r run at once, one per local rank (each over its
  // own NIC: one per GPU on both fabrics; on a rail-optimised one local rank i's peers sit on
  // the same leaf switch, so the inter stage crosses one switch hop instead of the spine).
  const double share = bytes / r;
  const double inter = seconds(op, share, nodes, CommLevel::kInter);
  switch (op) {
    case CommOp::allreduce:
      return seconds(CommOp::reduce_scatter, bytes, r, CommLevel::kIntra) + inter +
             seconds(CommOp::all_gather, bytes, r, CommLevel::kIntra);
    case CommOp::reduce_scatter:
      return seconds(CommOp::reduce_scatter, bytes, r, CommLevel::kIntra) + inter;
    default:  // all-gather
      return inter + seconds(CommOp::all_gather, bytes, r, CommLevel::kIntra);
  }
}

}  // namespace strata
