#include "plan/schedule_sim.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "parallel/pipeline_schedule.h"

namespace strata {

double ScheduleSim::bubble() const {
  double s = 0;
  for (double v : idle) s += v;
  return idle.empty() ? 0 : s / double(idle.size());
}

ScheduleSim simulate_schedule(const std::string& kind, int stages, int micros, int chunks,
                              const std::vector<std::vector<OpCosts>>& costs, double send_s) {
  const int P = stages, v = chunks;
  const bool split = splits_backward(kind);
  std::vector<std::vector<PipeOp>> ops;
  for (int s = 0; s < P; ++s) ops.push_back(pipeline_schedule(kind, P, s, micros, v));
  std::map<std::tuple<char, int, int>, double> done;  // (op, virtual stage, micro) -> finish
  std::vector<size_t> next(size_t(P), 0);
  ScheduleSim r;
  std::vector<double> clock(size_t(P), 0.0);
  r.busy.assign(size_t(P), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s)
      for (size_t& i = next[size_t(s)]; i < ops[size_t(s)].size(); ++i) {
        const PipeOp& o = ops[size_t(s)][i];
        const int vs = o.chunk * P + s;
        const int from = o.kind == PipeOp::kForward ? vs - 1 : o.kind == PipeOp::kBackward ? vs + 1 : -1;
        double ready = 0;
        if (from >= 0 && from < P * v && o.kind != PipeOp::kWeight) {
          auto it = done.find({char(o.kind), from, o.micro});
          if (it == done.end()) break;
          // A neighbour on another rank sends; a chunk's neighbour chunk on the same rank
          // (P = 1) does not.
          ready = it->second + (from % P != s ? send_s : 0.0);
        }
        const OpCosts& c = costs[size_t(s)][size_t(o.chunk)];
        const double cost = o.kind == PipeOp::kForward ? c.forward
                            : o.kind == PipeOp::kWeight ? c.backward_weight
                            : split                     ? c.backward_input
                                                        : c.backward;
        clock[size_t(s)] = std::max(clock[size_t(s)], ready) + cost;
        r.busy[size_t(s)] += cost;
        done[{char(o.kind), vs, o.micro}] = clock[size_t(s)];
        moved = true;
      }
  }
  for (int s = 0; s < P; ++s)
    if (next[size_t(s)] < ops[size_t(s)].size())
      throw std::logic_error("simulate_schedule: " + kind + " deadlocks");
  r.span = *std::max_element(clock.begin(), clock.end());
  r.finish = clock;
  for (int s = 0; s < P; ++s) r.idle.push_back(r.span > 0 ? (r.span - r.busy[size_t(s)]) / r.span : 0.0);
  return r;
}

}  // namespace strata
