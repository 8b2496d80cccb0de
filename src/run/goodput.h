// Goodput: the share of a job's wall time spent on training steps that count, across requeues
// and restarts inside the allocation, and where the rest of the time went.
//
// The ledger lives beside the checkpoints (<checkpoint.dir>/goodput.toml), so every attempt of
// a job finds it; rank 0 rewrites it atomically (temporary file, rename) at most once a second
// while training, at every checkpoint and at the end. One ledger per job: a start with another
// Slurm job id, or after the ledger's run finished, opens a new one.
//
// Accounting (docs/operations.md, "Goodput"), all wall-clock seconds since the job's first attempt began:
//   useful        the step time of every step in the run's history, each counted once
//   startup       from an srun step's launch to its first training step (the first attempt:
//                 from its batch script's start), every attempt
//   checkpoint    the training thread inside checkpoint saves (snapshot, or the whole write)
//   recompute     step time of steps run after the checkpoint a restart resumed from: lost
//                 with the fault, run again
//   restart_gap   from an attempt's last ledger update (at most ~1 s before it died) to the
//                 next attempt's launch, less the steps in that time a memory checkpoint
//                 kept: fault detection, teardown, the queue
//   other         the rest: evaluation, the final parameter file, logging
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata {

struct GoodputFigures {
  double wall_s = 0, useful_s = 0, startup_s = 0, checkpoint_stall_s = 0, recompute_s = 0,
         restart_gap_s = 0, other_s = 0;
  int64_t restarts = 0;  // attempts after the first, in the allocation or requeued
  // How those attempts resumed: from memory checkpoints, or from checkpoint files.
  int64_t restores_memory = 0, restores_file = 0;
  double ratio() const { return wall_s > 0 ? useful_s / wall_s : 0; }
};

// One restart, as the attempt after it saw it.
struct GoodputRestart {
  double at = 0;  // unix time of the new attempt's launch
  int64_t slurm_restart_count = 0, reached_step = 0, resumed_step = 0;
  double recompute_s = 0, restart_gap_s = 0, startup_s = 0;
  std::string source;  // "memory" | "file" | "" (from step 0)
};

class GoodputLedger {
 public:
  // Rank 0 passes the ledger's path; "" builds an inactive ledger (other ranks). Reads the
  // job's open ledger when there is one (an unreadable file is a warning and a new ledger).
  GoodputLedger(std::string path, std::string job_id, int64_t slurm_restart_count);
  ~GoodputLedger();  // writes a last update unless finish() did
  GoodputLedger(const GoodputLedger&) = delete;
  GoodputLedger& operator=(const GoodputLedger&) = delete;

  // Training starts with `start_step` steps done (the checkpoint resumed from, or 0), taken
  // from `source`: "memory" (memory checkpoints), "file" or "" (none). `useful_s`: the useful
  // time up to start_step when the checkpoint carried it (a memory checkpoint's, taken between
  // the ledger's writes: its steps are not lost); < 0: from the ledger's own marks.
  void begin(int64_t start_step, const std::string& source = "", double useful_s = -1);
  // A step ended with `steps_done` steps done; `seconds` its wall time, checkpoints excluded.
  void step_done(int64_t steps_done, double seconds);
  // The training thread spent `stall_s` in a checkpoint of `steps_done` steps. write_now:
  // the ledger is rewritten at once (else with the next update, at most a second later: for
  // memory checkpoints, taken as often as every step).
  void checkpoint(int64_t steps_done, double stall_s, bool write_now = true);
  GoodputFigures figures() const;
  // So far; -1 on an inactive ledger (a rank other than the lead's keeps none: its memory
  // checkpoints carry -1, so a restore from a replica's copy falls back to the ledger's marks).
  double useful_s() const { return active_ ? f_.useful_s : -1; }
  // The last update: `done` closes the ledger (the job's training is complete).
  void finish(bool done);

  const std::vector<GoodputRestart>& restarts() const { return restarts_; }

 private:
  struct Mark {  // a checkpoint's step and the useful time up to it
    int64_t step;
    double useful_s;
  };
  void read_existing();
  void write();
  double useful_at(int64_t step) const;

  std::string path_, job_;
  int64_t slurm_restarts_ = 0;
  bool active_ = false, open_ = false, finished_ = false;  // open_: continues an earlier attempt
  std::string state_ = "running";                          // "done" once the job finished
  double first_start_ = 0, last_update_ = 0, last_write_ = 0;
  GoodputFigures f_;
  int64_t step_ = 0;
  std::vector<Mark> marks_;
  std::vector<GoodputRestart> restarts_;
};

// "goodput 93.1% of 11m52s since the job's first attempt (useful 11m03s; lost: start-up 21s,
// checkpoint stalls 3s, recomputed steps 14s, restart gaps 9s, other 2s; 6 restarts)"; with
// memory checkpoints the restarts say where they resumed from ("6 restarts: 5 from memory, 1
// from files")
std::string describe_goodput(const GoodputFigures& f);
// The `done` metrics event's fields: goodput, goodput_wall_s, goodput_useful_s, lost_*_s,
// job_restarts (key, JSON value).
std::vector<std::pair<std::string, std::string>> goodput_fields(const GoodputFigures& f);

}  // namespace strata
