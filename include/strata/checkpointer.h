// The checkpoint directory of a run: when to write, atomic publication through the `latest`
// pointer, retention, and finding the checkpoint to resume from.
//
// Directory layout (README "Checkpoints"):
//   ckpt-000000120.h5   one complete checkpoint per file, named by step
//   latest              one line, the file name of the newest checkpoint every rank agreed on;
//                       replaced atomically (temporary file, fsync, rename) after each write
//   *.corrupt           checkpoints found damaged on resume, renamed (kept for inspection)
#pragma once
#include <cstdint>
#include <atomic>
#include <optional>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "strata/checkpoint.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/optim.h"

namespace strata {

class Checkpointer {
 public:
  Checkpointer(const RunConfig& cfg, Comm& comm);

  const std::string& dir() const { return dir_; }
  // Periodic checkpoints configured (every_steps or every_seconds).
  bool periodic() const { return every_steps_ > 0 || every_seconds_ > 0; }

  // Collective. Creates the directory (never world-writable), checks that it is writable and
  // has room for one more checkpoint of `bytes`, and removes temporary files a crash left.
  // Throws UserError naming the directory.
  void preflight(int64_t bytes);

  // Collective. Per cfg.resume ("never" | "auto" | a file): loads the checkpoint to continue
  // from into `model` and `opt` on every rank (rank 0 reads and verifies; the others receive
  // a broadcast) and returns its state; nullopt to start at step 0. Damaged checkpoints are
  // reported by name, renamed *.corrupt and skipped for the one before. Throws
  // UserError(kExitBadCheckpoint) if checkpoints exist but none verifies, or if the newest
  // one does not fit this run (model, global batch, seed, dataset).
  std::optional<TrainState> resume(Model& model, Optimizer& opt, const RunConfig& cfg,
                                   const std::string& dataset_sha256);

  struct SaveResult {
    bool ok = false;
    std::string path, error;
    int64_t step = 0, bytes = 0;
    double seconds = 0;  // rank 0's write time (tensors, CRCs, fsync, rename)
    double stall_s = 0;  // time the training thread spent in save() (the snapshot, if async)
  };
  // Collective. Writes a checkpoint of `model` and `opt` at `st` (sequence filled in), then the
  // `latest` pointer, then applies retention. A failed write leaves every earlier checkpoint
  // and the pointer as they were.
  //  - wait = true: returns when the file and pointer are on disk, the result the same on
  //    every rank (stop and final checkpoints).
  //  - wait = false: rank 0 copies the tensors to a snapshot buffer and writes it on a
  //    background thread while training goes on; the outcome comes from poll() later.
  // Call finish() first to collect the outcome of a write still in flight (save() waits for it
  // too, but does not report it).
  SaveResult save(const Model& model, Optimizer& opt, TrainState st, const Provenance& prov,
                  bool wait);
  // Rank 0: the outcome of a background write that has finished since the last call, if any.
  std::optional<SaveResult> poll();
  // Rank 0: waits for a background write in flight; its outcome, if there was one.
  std::optional<SaveResult> finish();
  ~Checkpointer();


 private:
  struct Entry {
    int64_t step;
    std::string name;
  };
  std::vector<Entry> list() const;  // ckpt-*.h5 in the directory, newest first
  std::optional<int64_t> pointer_step(std::string* name) const;
  void write_pointer(const std::string& name) const;
  void apply_retention(int64_t newest_step) const;

  Comm& comm_;
  std::string dir_;
  int64_t every_steps_;
  double every_seconds_;
  int64_t keep_last_, keep_every_;
  int64_t sequence_ = 0;
  mutable std::set<std::string> warned_;  // stray names reported once
  // Background write (rank 0).
  Tensor snapshot_;
  std::thread writer_;
  std::atomic<bool> writer_done_{false};
  SaveResult writer_result_;
  double writer_stall_s_ = 0;  // the save() time of the write in flight
};

// Checks that a checkpoint fits the run about to continue from it; throws
// UserError(kExitBadCheckpoint) naming the file and what differs.
void check_resumable(const LoadedCheckpoint& ck, const std::string& path, const Model& model,
                     const RunConfig& cfg, const std::string& dataset_sha256);

}  // namespace strata
