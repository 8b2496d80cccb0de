// Memory checkpoints that the optimizer's update writes itself (checkpoint.memory_every = 1 on
// the CPU): the parameters and the optimizer's state live in the two generations' mapped
// files of MemoryCheckpoints (open_slot), each update reads one generation and writes the
// other out of place (Optimizer::Target), adding the lane sums of what it stores. A save is
// then the part's head and its header (the file named the first time): no copy of the state is
// made.
//
// Out-of-place stores first read every line they write (for ownership), a cost in-place ones
// do not have. So when the next target's exchange is done by the time a step's backward
// starts, backward writes the gradients into the target's state that the update may write
// over its gradient (Optimizer::state_over_grad): that state is then written in place, and
// only the rest out of place (benchmarks/bench_update.cpp: "over grad"). The target is then
// marked as being written from the backward on, not the update.
//
// Where every rank holds the same part and replicas of it live on other nodes (data
// parallelism alone: MemoryCheckpoints::one_part(), no partner exchange), one generation is
// written in place: marked as being written for the update, sealed after it. A rank killed
// inside its update leaves a marked file, which a restart removes, and takes a replica's copy:
// the replicas' updates follow the same gradient sum, so a replica the restart kills has
// finished that update and waits in the next step's sums, unless the kill reaches it within
// an update's time of the fault (milliseconds on the benchmark models; slurm/train.sbatch
// kills tenths of a second after it). Only a fault that kills every replica inside its update
// sends the restart to the checkpoint files. In place, the update touches no more memory than
// without checkpoints. Not with several parts (pipeline stages, tensor parts):
// their updates run at different times, so one part could hold only step t + 1 while another
// still waits in step t + 1's sums, and two generations keep a step that all of them have.
#pragma once
#include <cstdint>

#include "checkpoint/memory_checkpoints.h"
#include "model/model.h"
#include "model/optim.h"
#include "strata/lane_sums.h"

namespace strata {

// Where a part's pieces lie in its payload, in floats: `head` floats first (where the run
// stands), then the values and each optimizer state, each on a 256-byte boundary (so an
// update can write a generation where it lies), zeros between.
struct PartLayout {
  int64_t values_at = 0, state_at[2] = {0, 0}, floats = 0;
};
PartLayout part_layout(Model& model, Optimizer& opt, int64_t head);

class UpdateGenerations {
 public:
  UpdateGenerations(MemoryCheckpoints& mem, Model& model, Optimizer& opt, const PartLayout& l);
  ~UpdateGenerations() { move_home(); }
  UpdateGenerations(const UpdateGenerations&) = delete;
  UpdateGenerations& operator=(const UpdateGenerations&) = delete;

  // Before the first update (after a restore took its copy): the state moves into generation
  // 0's file; false when that file cannot be made (warned). started(): it moved.
  bool start();
  bool started() const { return live_ >= 0; }
  // Before a step's backward (nothing before start()): if the other generation's exchange is
  // done, its file becomes the next update's target now (marked as being written) and the
  // gradients go into it (above); else they stay home. Never waits.
  void before_backward();
  // Before each update, once started: the other generation's file becomes its target
  // (*wait_s: the wait for the file's exchange), unless before_backward made it so.
  void before_update(double* wait_s);
  // After it: the parameters and the state are the target's from now on; the gradients are
  // back in their own buffer (where they were in the target, they are now its state).
  void after_update();
  // A save after `step` steps: `head` (the layout's head floats) into the generation the last
  // update wrote, then its header and name (MemoryCheckpoints::publish_slot).
  void save(int64_t step, const float* head, int64_t head_floats);
  // The state back from the files into the model's and optimizer's own buffers (before the
  // files are unmapped), and the gradients into theirs; no more updates are pointed at the
  // files.
  void move_home();
  // Updates that wrote a generation, and how many of them over the gradients (above).
  int64_t updates() const { return updates_; }
  int64_t over_grads() const { return over_grads_; }
  bool in_place() const { return mem_.one_part(); }  // one generation, written in place (above)

 private:
  void rebind(float* payload);  // the model and optimizer onto a generation's payload
  void grads_home();

  MemoryCheckpoints& mem_;
  Model& model_;
  Optimizer& opt_;
  PartLayout layout_;
  int live_ = -1;  // the generation the state lives in; -1 before the first update, after move_home
  Optimizer::Target target_;
  uint32_t sums_[kRunningWords] = {};  // the target's payload's lane sums
  bool written_ = false;               // an update wrote a generation not saved yet
  Tensor home_[3];  // the model's values and the optimizer's state buffers, for move_home
  Tensor home_grads_;
  float* opened_ = nullptr;  // the next target's payload, opened by before_backward()
  int64_t updates_ = 0, over_grads_ = 0;
};

}  // namespace strata
