// Pipeline schedules: the order of one stage's work in a training step, and what that order
// costs in idle time and memory when every stage runs it.
//
// Ops (S = stage, P stages, M micro-batches, every micro-batch m through every stage):
//   F  forward of m
//   B  the gradient at the stage's input (what stage S-1 waits for). In gpipe and 1f1b it is
//      the whole backward; in the zero-bubble schedules the parameter gradients are left out:
//   W  the parameter gradients of m (nothing waits for them: they fill the bubbles)
//
// Schedules:
//   gpipe  all M forwards, then all M backwards: M micro-batches' activations alive at once.
//   1f1b   P-S-1 forwards to fill the pipeline, then one forward and one backward in turn,
//          then the remaining backwards (PipeDream-Flush, Megatron-LM's default): at most P-S
//          alive. The same arithmetic as gpipe in another order: gradients are summed in
//          micro-batch order by both, so the two give bitwise-identical parameters.
//   zb-h1  (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) 1f1b's warm-up, then
//          F, B and the W of micro-batch m-S in turn, the W's left over at the end: stage S
//          defers its W's by S micro-batches, so the early stages' W's fill the cool-down in
//          which 1f1b waits for gradients. At most P micro-batches alive on any stage (1f1b's
//          worst stage); with F, B and W costing the same the bubble falls from 1f1b's
//          (P-1)/(M+P-1) to (P-1)/(3M+P-1).
//   zb-h2  2(P-S)-2 warm-up forwards and W deferred by 2S: at most 2P-1 alive; zb-h1's
//          bubble once M >= 2P-2 (more below), and at M >= 2P it stays there when B costs
//          more than W (zb-h1's grows).
//   interleaved  (Narayanan et al. 2021, Megatron-LM) each stage holds v chunks of the model,
//          stage S the chunks ("virtual stages") S, S+P, ..., so a micro-batch goes round the
//          P ranks v times. The stage's work is M v chunk-forwards, taken P micro-batches at
//          a time per chunk (chunk 0 of micro-batches 0..P-1, then chunk 1 of them, ...), and
//          as many chunk-backwards in the opposite chunk order: 2(P-S-1) + (v-1)P of them
//          forwards first, then one forward and one backward in turn. M must be a multiple of
//          P. A chunk is 1/v of a stage, so the fill and drain shrink v times: the bubble
//          falls to about (P-1)/(vM+P-1) at v times the point-to-point messages.
// Every schedule runs each stage's (each chunk's) B's in micro-batch order and its W's too, so
// the gradients are summed in the same order as 1f1b's: all give bitwise-identical parameters.
// A synchronous step (the gradient allreduce and the optimizer wait for every stage) keeps a
// bubble of at least (P-1)/(3M+P-1) for any order: stage S cannot start before S forwards.
#pragma once
#include <string>
#include <vector>

namespace strata {

struct PipeOp {
  enum Kind : char { kForward = 'F', kBackward = 'B', kWeight = 'W' } kind;
  int micro;
  int chunk = 0;  // interleaved: which of the stage's chunks
};

// Whether a schedule (config.h's pipeline_schedules()) splits backward into B and W.
bool splits_backward(const std::string& schedule);

// Stage `stage`'s ops for one step; `chunks` = v (1 but for interleaved). Throws on an unknown
// schedule or a shape it cannot run (config validation names the key before this is reached).
std::vector<PipeOp> pipeline_schedule(const std::string& kind, int stages, int stage, int micros,
                                      int chunks = 1);

// The most micro-batches a stage holds between a forward and the end of its backward (its W
// when split): the activation slots the schedule needs. Interleaved: chunk-micro-batches,
// each holding 1/v of a stage's activations.
int schedule_peak_live(const std::vector<PipeOp>& ops);

// Every stage running its ops as soon as its own previous op and the neighbour's op it waits
// for are done, F, B and W each costing one unit (an unsplit B two; a chunk's ops 1/v of
// that): per stage, the share of the step spent idle. This is each schedule's theoretical
// bubble. Empty if the schedules deadlock (a stage waiting for an op that never comes before
// its own), which a test rules out.
std::vector<double> schedule_idle_shares(const std::string& kind, int stages, int micros,
                                         int chunks = 1);

// The same simulation with each op's own cost: per (stage, chunk) seconds for F, the whole
// backward (gpipe, 1f1b, interleaved), and the zero-bubble schedules' B and W; each activation
// or gradient crossing to another stage takes `send_s` (the step-time model, src/plan/).
// schedule_idle_shares is this with unit costs.
struct OpCosts {
  double forward = 0;
  double backward = 0;  // the whole backward
  double backward_input = 0, backward_weight = 0;  // B and W (zb-h1, zb-h2)
};
struct ScheduleSim {
  double span = 0;             // from the first forward to the last op anywhere
  std::vector<double> busy;    // per stage: its own work
  std::vector<double> finish;  // per stage: when its last op ends
  std::vector<double> idle;    // per stage: (span - busy) / span; empty if the schedules deadlock
  double bubble() const;       // the idle shares' mean
};
// costs[stage][chunk]; chunks = v (1 but for interleaved). `capacity` in (0, stages): the
// stages share that many cores' worth of compute (more ranks than cores on a CPU node): with
// a stages computing at once each runs at min(1, capacity / a) of its speed, so a stage idle in
// its bubble leaves its share to the others (processor sharing). 0 or >= stages: each its own.
ScheduleSim simulate_schedule(const std::string& kind, int stages, int micros, int chunks,
                              const std::vector<std::vector<OpCosts>>& costs, double send_s = 0,
                              double capacity = 0);

// A schedule in theory, per stage: its idle share (schedule_idle_shares) and live bound
// (schedule_peak_live); `bubble` the idle shares' mean over the stages.
struct ScheduleTheory {
  std::vector<double> idle;
  std::vector<int> live;
  double bubble = 0;
};
ScheduleTheory schedule_theory(const std::string& kind, int stages, int micros, int chunks = 1);

}  // namespace strata
