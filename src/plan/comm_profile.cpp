#include "plan/comm_profile.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "base/metrics.h"
#include "base/parse.h"
#include "base/stats.h"
#include "strata/error.h"

namespace strata {

namespace {

constexpr CommOp kOps[] = {CommOp::allreduce, CommOp::reduce_scatter, CommOp::all_gather,
                           CommOp::sendrecv, CommOp::allreduce_blocking};

}  // namespace

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::allreduce: return "allreduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::sendrecv: return "sendrecv";
    case CommOp::allreduce_blocking: return "allreduce_blocking";
  }
  return "?";
}

CommOp parse_comm_op(const std::string& given, const std::string& flag) {
  // One item of "a, b" or "[a, b]" (a TOML array, as --help shows the default) split at commas.
  const size_t first = given.find_first_not_of(" \t[\"'");
  const size_t last = given.find_last_not_of(" \t]\"'");
  const std::string name = first == std::string::npos ? "" : given.substr(first, last - first + 1);
  for (CommOp op : kOps)
    if (name == comm_op_name(op)) return op;
  throw UserError(kExitBadInput,
                  fmt::format("flag {}: unknown op '{}'; the ops: allreduce, reduce_scatter, "
                              "all_gather, sendrecv, allreduce_blocking", flag, name));
}

double busbw_factor(CommOp op, int ranks) {
  const double n = ranks;
  switch (op) {
    case CommOp::allreduce:
    case CommOp::allreduce_blocking: return n > 1 ? 2 * (n - 1) / n : 0;
    case CommOp::reduce_scatter:
    case CommOp::all_gather: return n > 1 ? (n - 1) / n : 0;
    case CommOp::sendrecv: return 1;
  }
  return 0;
}

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  constexpr int64_t kMax = int64_t(4) << 30;
  std::string digits = text;
  int64_t unit = 1;
  if (!digits.empty()) {
    const char s = digits.back();
    const int64_t u = s == 'K' || s == 'k' ? 1 << 10 : s == 'M' || s == 'm' ? 1 << 20
                      : s == 'G' || s == 'g' ? int64_t(1) << 30 : 1;
    if (u > 1) {
      unit = u;
      digits.pop_back();
    }
  }
  std::string why;
  const auto v = parse_int(digits, &why);
  if (!v || *v <= 0 || *v > kMax / unit)
    throw UserError(kExitBadInput,
                    fmt::format("flag {}: expected a size in bytes from 1 to 4G (8, 64K, 1M, 1G), "
                                "got '{}'", flag, text));
  return *v * unit;
}

std::optional<CommFit> fit_comm(const std::vector<CommMeasurement>& all, CommOp op,
                                const std::string& level) {
  std::vector<const CommMeasurement*> m;
  for (const auto& x : all)
    if (x.op == op && x.level == level) m.push_back(&x);
  if (m.empty()) return std::nullopt;
  std::vector<double> small, large;
  for (const auto* x : m) {
    if (x->bytes <= 4096) small.push_back(x->time_s);
    if (x->bytes >= (1 << 20)) large.push_back(x->busbw_Bps());
  }
  if (small.empty()) small.push_back(m.front()->time_s);
  if (large.empty()) large.push_back(m.back()->busbw_Bps());
  return CommFit{median(small), median(large)};
}

double predicted_time_s(const CommFit& f, CommOp op, int64_t bytes, int ranks) {
  const double factor = busbw_factor(op, ranks);
  return f.latency_s + (f.busbw_Bps > 0 ? double(bytes) * factor / f.busbw_Bps : 0.0);
}

std::string comm_profile_json(const CommProfile& p) {
  std::string out = fmt::format(
      "{{\n  \"strata_comm_profile\": 1,\n  \"source\": \"measured\",\n  \"date\": {},\n"
      "  \"host\": {},\n  \"strata\": {},\n  \"backend\": {},\n  \"device\": {},\n"
      "  \"ranks\": {},\n  \"nodes\": {},\n  \"ranks_per_node\": {},\n  \"iters\": {},\n"
      "  \"warmup\": {},\n  \"rounds\": {},\n  \"fit\": {{",
      json_string(p.date), json_string(p.host), json_string(p.strata_version), json_string(p.backend),
      json_string(p.device), p.ranks, p.nodes, p.ranks_per_node, p.iters, p.warmup, p.rounds);
  const char* sep = "";
  for (CommOp op : kOps) {
    std::string levels;
    for (const char* level : {"intra", "inter"})
      if (auto f = fit_comm(p.measurements, op, level))
        levels += fmt::format("{}\"{}\": {{\"latency_s\": {}, \"busbw_Bps\": {}}}",
                              levels.empty() ? "" : ", ", level, json_number(f->latency_s),
                              json_number(f->busbw_Bps));
    if (levels.empty()) continue;
    out += fmt::format("{}\n    \"{}\": {{{}}}", sep, comm_op_name(op), levels);
    sep = ",";
  }
  out += "\n  },\n  \"measurements\": [";
  sep = "";
  for (const auto& m : p.measurements) {
    out += fmt::format("{}\n    {{\"op\": \"{}\", \"level\": \"{}\", \"ranks\": {}, \"bytes\": {}, "
                       "\"time_s\": {}, \"algbw_Bps\": {}, \"busbw_Bps\": {}}}",
                       sep, comm_op_name(m.op), m.level, m.ranks, m.bytes, json_number(m.time_s),
                       json_number(m.algbw_Bps()), json_number(m.busbw_Bps()));
    sep = ",";
  }
  return out + "\n  ]\n}\n";
}

std::string comm_table_header() {
  return fmt::format("{:<15} {:>12} {:>12} {:>12} {:>12}  {}", "op", "bytes", "time_us",
                     "algbw_GB/s", "busbw_GB/s", "level");
}

std::string comm_table_row(const CommMeasurement& m) {
  return fmt::format("{:<15} {:>12} {:>12.2f} {:>12.3f} {:>12.3f}  {} ({} ranks)",
                     comm_op_name(m.op), m.bytes, m.time_s * 1e6, m.algbw_Bps() / 1e9,
                     m.busbw_Bps() / 1e9, m.level, m.ranks);
}

std::string default_comm_profile_name(const std::string& host) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string safe;
  for (char c : host) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return fmt::format("bench-comm-{}-{}.json", safe, stamp);
}

}  // namespace strata
