#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "strata/error.h"

namespace strata {

bool splits_backward(const std::string& schedule) { return schedule == "zb-h1" || schedule == "zb-h2"; }

namespace {

using Op = PipeOp;

// `warmup` forwards, then F, B and (split) the W of micro-batch m - defer, in turn; the
// forwards run out first, then the backwards, then the deferred W's.
std::vector<Op> interleave(int micros, int warmup, bool split, int defer) {
  std::vector<Op> ops;
  int f = 0, w = 0;
  for (; f < std::min(warmup, micros); ++f) ops.push_back({Op::kForward, f});
  for (int b = 0; b < micros; ++b) {
    if (f < micros) ops.push_back({Op::kForward, f++});
    ops.push_back({Op::kBackward, b});
    for (; split && w <= b - defer; ++w) ops.push_back({Op::kWeight, w});
  }
  for (; split && w < micros; ++w) ops.push_back({Op::kWeight, w});
  return ops;
}

// Interleaved 1F1B: the k-th chunk-forward of a stage is micro-batch (k / Pv) P + k % P of
// chunk (k / P) % v; its k-th chunk-backward the same micro-batch of chunk v-1 - (k / P) % v.
std::vector<Op> interleaved(int P, int S, int M, int v) {
  STRATA_CHECK(M % P == 0, "interleaved: {} micro-batches over {} stages", M, P);
  const int total = M * v, warmup = std::min(2 * (P - S - 1) + (v - 1) * P, total);
  auto at = [&](int k, bool forward) {
    const int c = (k / P) % v;
    return Op{forward ? Op::kForward : Op::kBackward, (k / (P * v)) * P + k % P, forward ? c : v - 1 - c};
  };
  std::vector<Op> ops;
  for (int k = 0; k < warmup; ++k) ops.push_back(at(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(at(warmup + k, true));
    ops.push_back(at(k, false));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(at(k, false));
  return ops;
}

}  // namespace

std::vector<PipeOp> pipeline_schedule(const std::string& kind, int stages, int stage, int micros,
                                      int chunks) {
  const int P = stages, S = stage;
  STRATA_CHECK(chunks == 1 || kind == "interleaved", "{} chunks for schedule '{}'", chunks, kind);
  if (kind == "interleaved") return chunks == 1 ? interleave(micros, P - S - 1, false, 0)
                                                : interleaved(P, S, micros, chunks);
  if (kind == "gpipe") {
    std::vector<Op> ops;
    for (int m = 0; m < micros; ++m) ops.push_back({Op::kForward, m});
    for (int m = 0; m < micros; ++m) ops.push_back({Op::kBackward, m});
    return ops;
  }
  if (kind == "1f1b") return interleave(micros, P - S - 1, false, 0);
  if (kind == "zb-h1") return interleave(micros, P - S - 1, true, S);
  if (kind == "zb-h2") return interleave(micros, 2 * (P - S) - 2, true, 2 * S);
  STRATA_CHECK(false, "unknown pipeline schedule '{}'", kind);
  return {};
}

int schedule_peak_live(const std::vector<PipeOp>& ops) {
  const bool split = std::any_of(ops.begin(), ops.end(), [](const Op& o) { return o.kind == Op::kWeight; });
  int live = 0, peak = 0;
  for (const Op& o : ops) {
    if (o.kind == Op::kForward) peak = std::max(peak, ++live);
    else if (o.kind == (split ? Op::kWeight : Op::kBackward)) --live;
  }
  return peak;
}

double ScheduleSim::bubble() const {
  double s = 0;
  for (double v : idle) s += v;
  return idle.empty() ? 0 : s / double(idle.size());
}

namespace {

// The virtual stage whose op `o` (on stage s) waits for: F for the one before's F, B for the one
// after's B; -1 for none (W, and the ends of the pipeline).
int dependency(const PipeOp& o, int s, int P, int v) {
  const int vs = o.chunk * P + s;
  const int from = o.kind == Op::kForward ? vs - 1 : o.kind == Op::kBackward ? vs + 1 : -1;
  return from >= 0 && from < P * v ? from : -1;
}

double op_cost(const PipeOp& o, const OpCosts& c, bool split) {
  return o.kind == Op::kForward  ? c.forward
         : o.kind == Op::kWeight ? c.backward_weight
         : split                 ? c.backward_input
                                 : c.backward;
}

// Finish times by (op kind, virtual stage, micro-batch), negative until the op is done; flat,
// as the simulations look one up per op (a std::map of them was most of strata plan's time at
// thousands of micro-batches).
class DoneTimes {
 public:
  DoneTimes(int virtual_stages, int micros)
      : vs_(virtual_stages), m_(micros), t_(size_t(3) * size_t(vs_) * size_t(m_), -1.0) {}
  double& at(char kind, int vs, int micro) {
    const size_t k = kind == Op::kForward ? 0 : kind == Op::kBackward ? 1 : 2;
    return t_[(k * size_t(vs_) + size_t(vs)) * size_t(m_) + size_t(micro)];
  }

 private:
  int vs_, m_;
  std::vector<double> t_;
};

// The most micro-batch index any stage's list names, plus one.
int micro_count(const std::vector<std::vector<Op>>& ops) {
  int n = 0;
  for (const auto& list : ops)
    for (const Op& o : list) n = std::max(n, o.micro + 1);
  return n;
}

// simulate_schedule with the stages sharing `capacity` cores' worth of compute: from event to
// event (an op's end, a dependency's arrival) every computing stage advances at
// min(1, capacity / computing). An op starts when its stage's previous op is done and its
// dependency (with the send) has arrived, as in the plain simulation.
ScheduleSim simulate_shared(const std::vector<std::vector<Op>>& ops, int P, int v, bool split,
                            const std::vector<std::vector<OpCosts>>& costs, double send_s,
                            double capacity) {
  DoneTimes done(P * v, micro_count(ops));
  std::vector<size_t> next(size_t(P), 0);
  std::vector<double> left(size_t(P), -1), ready(size_t(P), 0);  // left < 0: no op under way
  ScheduleSim r;
  r.finish.assign(size_t(P), 0.0);
  r.busy.assign(size_t(P), 0.0);
  for (double now = 0;;) {
    int computing = 0, waiting = 0;
    double wake = 1e300;  // the next dependency's arrival
    for (int s = 0; s < P; ++s) {
      if (left[size_t(s)] < 0 && next[size_t(s)] < ops[size_t(s)].size()) {  // the next op's start
        const Op& o = ops[size_t(s)][next[size_t(s)]];
        const int from = dependency(o, s, P, v);
        double at = now;
        if (from >= 0) {
          const double t = done.at(o.kind, from, o.micro);
          if (t < 0) continue;
          at = std::max(now, t + (from % P != s ? send_s : 0.0));
        }
        const double c = op_cost(o, costs[size_t(s)][size_t(o.chunk)], split);
        left[size_t(s)] = c, ready[size_t(s)] = at;
        r.busy[size_t(s)] += c;
      }
      if (left[size_t(s)] < 0) continue;
      if (ready[size_t(s)] > now) ++waiting, wake = std::min(wake, ready[size_t(s)]);
      else ++computing;
    }
    if (computing == 0 && waiting == 0) break;  // every stage done, or deadlocked (checked below)
    const double rate = computing ? std::min(1.0, capacity / computing) : 0;
    double step = wake - now;
    for (int s = 0; s < P; ++s)
      if (left[size_t(s)] >= 0 && ready[size_t(s)] <= now) step = std::min(step, left[size_t(s)] / rate);
    const double before = now;
    now += step;
    for (int s = 0; s < P; ++s) {
      if (left[size_t(s)] < 0 || ready[size_t(s)] > before) continue;
      left[size_t(s)] -= step * rate;
      if (left[size_t(s)] > 1e-12 * (1 + r.busy[size_t(s)])) continue;
      const Op& o = ops[size_t(s)][next[size_t(s)]++];
      done.at(o.kind, o.chunk * P + s, o.micro) = now;
      r.finish[size_t(s)] = now;
      left[size_t(s)] = -1;
    }
  }
  for (int s = 0; s < P; ++s)
    if (next[size_t(s)] < ops[size_t(s)].size()) return r;  // deadlock: no idle shares
  r.span = *std::max_element(r.finish.begin(), r.finish.end());
  for (int s = 0; s < P; ++s) r.idle.push_back(r.span > 0 ? (r.span - r.busy[size_t(s)]) / r.span : 0.0);
  return r;
}

}  // namespace

ScheduleSim simulate_schedule(const std::string& kind, int stages, int micros, int chunks,
                              const std::vector<std::vector<OpCosts>>& costs, double send_s,
                              double capacity) {
  const int P = stages, v = chunks;
  const bool split = splits_backward(kind);
  std::vector<std::vector<Op>> ops;
  for (int s = 0; s < P; ++s) ops.push_back(pipeline_schedule(kind, P, s, micros, v));
  if (capacity > 0 && capacity < P) return simulate_shared(ops, P, v, split, costs, send_s, capacity);
  // Finish times of F and B per (virtual stage c P + s, micro-batch); each stage runs its list
  // in order. F waits for the virtual stage before's F of the same micro-batch, B for the one
  // after's B, plus the send when that one is on another stage.
  DoneTimes done(P * v, micro_count(ops));
  std::vector<size_t> next(size_t(P), 0);
  ScheduleSim r;
  r.finish.assign(size_t(P), 0.0);
  r.busy.assign(size_t(P), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s)
      for (size_t& i = next[size_t(s)]; i < ops[size_t(s)].size(); ++i) {
        const Op& o = ops[size_t(s)][i];
        const int vs = o.chunk * P + s, from = dependency(o, s, P, v);
        double ready = 0;
        if (from >= 0) {
          const double t = done.at(o.kind, from, o.micro);
          if (t < 0) break;
          ready = t + (from % P != s ? send_s : 0.0);
        }
        const double cost = op_cost(o, costs[size_t(s)][size_t(o.chunk)], split);
        r.finish[size_t(s)] = std::max(r.finish[size_t(s)], ready) + cost;
        r.busy[size_t(s)] += cost;
        done.at(o.kind, vs, o.micro) = r.finish[size_t(s)];
        moved = true;
      }
  }
  for (int s = 0; s < P; ++s)
    if (next[size_t(s)] < ops[size_t(s)].size()) return r;  // deadlock: no idle shares
  r.span = *std::max_element(r.finish.begin(), r.finish.end());
  for (int s = 0; s < P; ++s) r.idle.push_back(r.span > 0 ? (r.span - r.busy[size_t(s)]) / r.span : 0.0);
  return r;
}

std::vector<double> schedule_idle_shares(const std::string& kind, int stages, int micros,
                                         int chunks) {
  // F, B and W one unit each, an unsplit B two; a chunk's ops 1/v of that.
  const double u = 1.0 / chunks;
  const std::vector<std::vector<OpCosts>> unit(size_t(stages),
                                               std::vector<OpCosts>(size_t(chunks), OpCosts{u, 2 * u, u, u}));
  return simulate_schedule(kind, stages, micros, chunks, unit).idle;
}

ScheduleTheory schedule_theory(const std::string& kind, int stages, int micros, int chunks) {
  ScheduleTheory t{.idle = schedule_idle_shares(kind, stages, micros, chunks), .live = {}};
  for (double v : t.idle) t.bubble += v / double(stages);
  for (int s = 0; s < stages; ++s)
    t.live.push_back(schedule_peak_live(pipeline_schedule(kind, stages, s, micros, chunks)));
  return t;
}

}  // namespace strata
