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
//   zb-h2  2(P-S)-2 warm-up forwards and W deferred by 2S: at most 2P-1 alive, and the
//          bubble stays at that bound when B costs more than W (zb-h1's grows).
// Every schedule runs each stage's B's in micro-batch order and its W's too, so the gradients
// are summed in the same order as 1f1b's: all four give bitwise-identical parameters.
// A synchronous step (the gradient allreduce and the optimizer wait for every stage) keeps a
// bubble of at least (P-1)/(3M+P-1) for any order: stage S cannot start before S forwards.
#pragma once
#include <string>
#include <vector>

namespace strata {

struct PipeOp {
  enum Kind : char { kForward = 'F', kBackward = 'B', kWeight = 'W' } kind;
  int micro;
};

// The schedules parallel.schedule accepts, and whether a schedule splits backward into B and W.
const std::vector<std::string>& pipeline_schedules();
bool splits_backward(const std::string& schedule);

// Stage `stage`'s ops for one step (throws on an unknown schedule: config validation names
// the key before this is reached).
std::vector<PipeOp> pipeline_schedule(const std::string& kind, int stages, int stage, int micros);

// The most micro-batches a stage holds between a forward and the end of its backward (its W
// when split): the activation slots the schedule needs.
int schedule_peak_live(const std::vector<PipeOp>& ops);

// Every stage running its ops as soon as its own previous op and the neighbour's op it waits
// for are done, F, B and W each costing one unit (an unsplit B two): per stage, the share of
// the step spent idle. This is each schedule's theoretical bubble. Empty if the schedules
// deadlock (a stage waiting for an op that never comes before its own), which a test rules out.
std::vector<double> schedule_idle_shares(const std::string& kind, int stages, int micros);

}  // namespace strata
