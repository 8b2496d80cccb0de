// The run's side of memory checkpoints (checkpoint/memory_checkpoints.h): what a rank's part
// holds, packed into one buffer (where the run stands, this rank's parameters: its stage's
// tensor part, and its optimizer state: its ZeRO shard), when it is saved (a step hook every
// checkpoint.memory_every steps), and the restore at a restart. Randomness is keyed by
// (seed, epoch, step, sample), so the position in the data order is all of the loader and RNG
// state a resumed run needs.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/memory_checkpoints.h"
#include "config/config.h"
#include "model/model.h"
#include "model/optim.h"
#include "run/goodput.h"
#include "run/save_window.h"
#include "run/update_probe.h"
#include "run/step_hooks.h"
#include "run/update_generations.h"
#include "strata/backend.h"
#include "strata/comm.h"

namespace strata {

// checkpoint.memory_budget: the save interval that keeps memory checkpoints within `budget` of
// the step time. A save's time (the training thread's stall, and the copy and exchange off
// it, counted as if they took the step's core: a spare core makes them cheaper) over the
// budget's share of a step (without the stall), at least `first` and at most the interval
// whose steps take `max_recompute_s`, what a fault may cost in recomputed steps.
struct MemoryInterval {
  int64_t every;
  bool capped;  // the budget would need more steps than max_recompute_s allows
};
MemoryInterval memory_interval(double per_save_s, double step_s, double budget, int64_t first,
                               double max_recompute_s);

class MemoryState {
 public:
  // Collective; nullptr on every rank when checkpoint.memory_every is 0. Checks the memory
  // directory's room (UserError) and prints the start-up line (rank 0).
  // `grid`: the run's grid in words (a copy of another grid is never taken). same_as: ranks
  // passing the same key >= 0 hold the same part (data-parallel replicas without ZeRO: the
  // key of their stage and tensor part), -1 a part of its own (MemoryCheckpoints).
  // With checkpoint.memory_every = 1 on the CPU (an unsharded optimizer whose every update
  // writes its state: Optimizer::can_update_to), the update itself writes each generation:
  // the parameters and the optimizer's state live in the two generations' mapped files, and
  // each update reads one and writes the other (in_update()); with data parallelism alone
  // and replicas on other nodes, one generation written in place (run/update_generations.h).
  // No copy is made.
  static std::unique_ptr<MemoryState> make(const RunConfig& cfg, Comm& comm, const Backend& be,
                                           const std::string& grid, int64_t same_as, Model& model,
                                           Optimizer& opt);
  MemoryState(const RunConfig& cfg, Comm& comm, const Backend& be, const std::string& grid,
              int64_t same_as, Model& model, Optimizer& opt);

  // Collective, under --resume auto. Restores this rank's part of the newest complete memory
  // generation into the model and optimizer (host copies) when it is at least as new as
  // `file_step` (the newest checkpoint in checkpoint.dir or a node-local cache; -1: none) and
  // returns its state; nullopt to resume from the files. Rank 0 prints which copy and why.
  std::optional<TrainState> restore(int64_t file_step);
  // The goodput ledger's useful time at the step restore() took (rank 0's part carries it);
  // -1 before a restore.
  double restored_useful_s() const { return restored_useful_s_; }
  // A save after `steps_done` steps, packed and sent in the background; returns the training
  // thread's stall (seconds). useful_s: the goodput ledger's useful time so far (rank 0).
  double save(int64_t steps_done, int64_t per_epoch, const Backend& be, double useful_s);
  // Before the optimizer's update changes the state: waits for the last save's copy to be
  // taken (normally done during the step's forward and backward). Returns the wait. In
  // in_update(): makes the other generation's file the update's target instead (the first
  // time collectively: every rank moves its state into the files, or none does).
  double fence();
  // After the update (in_update()): the parameters and state are the target's from now on.
  void after_update();
  // Before the step's first backward (in_update()): the gradients into the next target, if
  // its exchange is done (UpdateGenerations::before_backward).
  void before_backward() {
    if (gens_) gens_->before_backward();  // (nothing before its start(): the in-place phase)
  }
  bool in_update() const { return gens_ != nullptr; }
  // Whether a save follows the step that made `steps_done` (none while the budget's probe
  // times the update in place).
  bool saves_at(int64_t steps_done) const {
    return probe_.phase() != UpdateProbe::Phase::in_place && steps_done % every_ == 0;
  }
  // The run ends: the writes in flight finish, rank 0 prints the saves' stalls; `remove`:
  // this rank's copies are deleted (a finished run, or a stop whose checkpoint is in
  // checkpoint.dir).
  void finish(bool remove);
  // The exchange yields to the training thread's gradient sums (comm/traffic_gate.h).
  void set_gate(const TrafficGate* g) { mem_.set_gate(g); }
  // Collective (every rank calls it after the same steps). Notes a step's wall time and, with
  // checkpoint.memory_budget, after every kAdaptSaves saves sets the interval from their times
  // (the longest any rank needs), or first decides whether the update may write every
  // generation (Probe); rank 0 prints a change and why.
  void after_step(int64_t steps_done, double step_s);
  int rank() const { return comm_.rank(); }

 private:
  // 4 int64 (step, epoch, batch, optimizer steps) and a double (the ledger's useful time)
  static constexpr int64_t kUsefulAt = 8;  // the double's offset, in floats
  static constexpr int64_t kStateFloats = 10;
  static_assert(kUsefulAt * sizeof(float) == 4 * sizeof(int64_t) &&
                (kStateFloats - kUsefulAt) * sizeof(float) == sizeof(double));
  static constexpr size_t kAdaptSaves = 16;    // saves measured before the budget sets the interval
  static constexpr double kMaxRecomputeS = 0.5;  // the steps a fault may redo, at most
  void adapt(int64_t steps_done);
  // checkpoint.memory_budget where the update can write the generations (UpdateProbe): if
  // that costs more than the budget on any rank, copies take over, whose interval adapt()
  // sets as without generations.
  void decide(int64_t steps_done);
  // A slot's pinned host buffer for a GPU's state (Backend::alloc_pinned/free_pinned).
  using Pinned = std::unique_ptr<char, void (*)(void*)>;
  void start_device_copy(const Backend& be, int slot);
  // Before mem_: its copy thread reads them until it is joined.
  Pinned staging_[2] = {Pinned(nullptr, nullptr), Pinned(nullptr, nullptr)};
  size_t state_bytes_;  // the model's values and the optimizer's state, as a GPU holds them
  PartLayout layout_;  // (part_layout: the 4 int64 and the double first)
  MemoryCheckpoints mem_;
  Comm& comm_;
  Model& model_;
  Optimizer& opt_;
  int64_t every_;
  double budget_;              // checkpoint.memory_budget (0: every_ stays)
  int64_t first_every_;        // checkpoint.memory_every: the shortest interval
  std::unique_ptr<UpdateGenerations> gens_;  // in_update(); after mem_: destroyed first
  UpdateProbe probe_{false, kAdaptSaves};
  int64_t earlier_saves_ = 0;  // the saves the update wrote before copies took over
  double restored_useful_s_ = -1;
  size_t window_ = 0;          // the saves before this measuring window (stalls_'s indices)
  SaveWindow step_times_;      // the window's step times
  std::vector<double> stalls_;
  std::vector<double> windows_;  // from each save to the update that waits for its copy
  std::vector<double> fences_;   // that update's wait
  const Backend* device_ = nullptr;  // saves copy a GPU's state on its copy stream
  int last_slot_ = 0;
  std::chrono::steady_clock::time_point saved_;
  bool finished_ = false;
};

// Saves where MemoryState::saves_at() says (the session also calls fence() before each update).
// The stall counts in the goodput ledger as a checkpoint's (its step is a resume point).
std::unique_ptr<StepHook> memory_checkpoint_hook(MemoryState& m, int64_t per_epoch,
                                                 const Backend& be, GoodputLedger& goodput);

}  // namespace strata
