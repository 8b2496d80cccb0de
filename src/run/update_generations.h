// Memory checkpoints that the optimizer's update writes itself (checkpoint.memory_every = 1 on
// the CPU): the parameters and the optimizer's state live in the two generations' mapped
// files of MemoryCheckpoints (open_slot), each update reads one generation and writes the
// other out of place (Optimizer::Target), adding the lane sums of what it stores. A save is
// then the part's head, its header and a rename: no copy of the state is made.
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
  // Before each update, once started: the other generation's file becomes its target
  // (*wait_s: the wait for the file's exchange).
  void before_update(double* wait_s);
  // After it: the parameters and the state are the target's from now on.
  void after_update();
  // A save after `step` steps: `head` (the layout's head floats) into the generation the last
  // update wrote, then its header and name (MemoryCheckpoints::publish_slot).
  void save(int64_t step, const float* head, int64_t head_floats);
  // The state back from the files into the model's and optimizer's own buffers (before the
  // files are unmapped); no more updates are pointed at the files.
  void move_home();

 private:
  void rebind(float* payload);  // the model and optimizer onto a generation's payload

  MemoryCheckpoints& mem_;
  Model& model_;
  Optimizer& opt_;
  PartLayout layout_;
  int live_ = -1;  // the generation the state lives in; -1 before the first update, after move_home
  Optimizer::Target target_;
  uint32_t sums_[kRunningWords] = {};  // the target's payload's lane sums
  bool written_ = false;               // an update wrote a generation not saved yet
  Tensor home_[3];  // the model's values and the optimizer's state buffers, for move_home
};

}  // namespace strata
