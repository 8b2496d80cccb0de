// The checkpoint directory of a run: when to write, atomic publication through the `latest`
// pointer, retention, and finding the checkpoint to resume from.
//
// Directory layout (docs/checkpoints.md):
//   ckpt-000000120.h5   one complete checkpoint per file, named by step
//   latest              one line, the file name of the newest checkpoint every rank agreed on;
//                       replaced atomically (temporary file, fsync, rename) after each write
//   *.corrupt           checkpoints found damaged on resume, renamed (kept for inspection)
//   cache-id            with checkpoint.local_dir: names this run's node-local cache
//                       directories (checkpoint_cache.h)
#pragma once
#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_cache.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/policy.h"
#include "checkpoint/writer.h"
#include "config/config.h"
#include "model/optim.h"
#include "strata/comm.h"

namespace strata {

class Checkpointer {
 public:
  // `writer`: the run's (writer.h; the run plan chose it).
  Checkpointer(const RunConfig& cfg, Comm& comm, CheckpointWriterKind writer);

  const std::string& dir() const { return shared_.path(); }
  // This node's local cache directory ("" without checkpoint.local_dir); after preflight.
  const std::string& local_dir() const {
    static const std::string none;
    return cache_ ? cache_->path() : none;
  }
  // When checkpoints are due (policy.h), and who writes them (writer.h).
  const CheckpointPolicy& policy() const { return policy_; }
  const CheckpointWriter& writer() const { return *file_writer_; }

  // Collective. Creates the directory (never world-writable), checks that it is writable and
  // has room for one more checkpoint of `bytes`, and removes temporary files a crash left.
  // With checkpoint.local_dir, the same for rank 0's local cache directory. Throws UserError
  // naming the directory, also when a new run (--resume never) finds an earlier run's
  // checkpoints there: it would write over them and move `latest` back.
  void preflight(int64_t bytes);

  // Collective. Per cfg.resume ("never" | "auto" | a file): loads the checkpoint to continue
  // from into `model` and `opt` on every rank (one rank reads and verifies: rank 0, or with a
  // local cache the lowest rank whose node holds the newest copy at least as new as the
  // shared `latest`; the others receive a broadcast) and returns its state; nullopt to start
  // at step 0. Damaged checkpoints are
  // reported by name, renamed *.corrupt and skipped for the one before. Throws
  // UserError(kExitBadCheckpoint) if checkpoints exist but none verifies, or if the newest
  // one does not fit this run (model, global batch, seed, dataset).
  // opt_into: the (unsharded) optimizer to load the state into, asked for only when a
  // checkpoint is found (with ZeRO it is made then, for a moment).
  std::optional<TrainState> resume(Model& model, const std::function<Optimizer&()>& opt_into,
                                   const RunConfig& cfg, const std::string& dataset_sha256);

  // Collective: the step of the newest checkpoint file, in checkpoint.dir (by `latest`) or
  // a node-local cache, unverified; -1 when there is none.
  int64_t newest_file_step();

  struct SaveResult {
    bool ok = false;
    std::string path, error;
    int64_t step = 0, bytes = 0;
    double seconds = 0;  // rank 0's write time (tensors, CRCs, fsync, rename)
    double stall_s = 0;  // time the training thread spent on it: the caller's preparation
                         // (before_s) and save() (the snapshot, if async)
    double copy_s = 0;   // local cache: the newest copy to checkpoint.dir's time
  };
  // Collective. Writes a checkpoint of `model` and `opt` at `st` (sequence filled in), then the
  // `latest` pointer, then applies retention. A failed write leaves every earlier checkpoint
  // and the pointer as they were.
  //  - wait = true: returns when the file and pointer are on disk, the result the same on
  //    every rank (stop and final checkpoints; periodic ones without checkpoint.async). With a
  //    local cache and `durable` (stop and final checkpoints) only once the copy is in
  //    checkpoint.dir too; otherwise the copy follows in the background.
  //  - wait = false: rank 0 copies the tensors to a snapshot buffer and writes it on a
  //    background thread while training goes on; the outcome comes from poll() later.
  // Call finish() first to collect the outcome of a write still in flight (save() waits for it
  // too, but does not report it).
  // before_s: the caller's time preparing this checkpoint (copies to the host, gathering
  // stages or shards), counted in stall_s.
  SaveResult save(const Model& model, Optimizer& opt, TrainState st, const Provenance& prov,
                  bool wait, bool durable = false, double before_s = 0);
  // Collective, synchronous, with a writer where every rank writes (the parallel one): the
  // same checkpoint written by every rank at once, each its ZeRO shard of its stage, then
  // rank 0's `latest` and retention. Without tensor parts or a local cache.
  SaveResult save_every_rank(const Model& model, Optimizer& opt, TrainState st,
                             const Provenance& prov, double before_s = 0);
  // Rank 0: the outcome of a background write that has finished since the last call, if any;
  // else a failed copy to checkpoint.dir (ok = false), if any.
  std::optional<SaveResult> poll();
  // Rank 0: waits for a background write in flight and reports its outcome, with any copy to
  // checkpoint.dir that has failed so far (ok = false); `copies` (the end of a run): waits
  // for every copy in flight too.
  std::optional<SaveResult> finish(bool copies = false);
  ~Checkpointer();


 private:
  // After a checkpoint in `d`: `latest` points at it, and retention (keep_every in the shared
  // directory only: a node-local cache is no archive).
  void publish(const CheckpointDir& d, int64_t step) const;
  void prepare_local_cache(int64_t bytes);
  SharedCopier& copier();
  // Rank 0: the failed copies to checkpoint.dir since the last call, as one result.
  std::optional<SaveResult> copy_failures(bool wait);

  Comm& comm_;
  CheckpointDir shared_;                  // checkpoint.dir
  std::unique_ptr<CheckpointDir> cache_;  // this node's cache dir, with checkpoint.local_dir
  CheckpointPolicy policy_;
  std::unique_ptr<CheckpointWriter> file_writer_;
  int64_t keep_last_, keep_every_;
  std::string local_config_;  // checkpoint.local_dir as given
  bool fresh_;                // --resume never: a new run
  std::unique_ptr<SharedCopier> copier_;
  int64_t sequence_ = 0;
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
