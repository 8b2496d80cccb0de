// A directory of checkpoint files (checkpoint.dir, or a node's local cache): the files by step,
// the `latest` pointer, retention, and the newest checkpoint that verifies. Rank-local; the
// Checkpointer decides who calls what.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace strata {

// "ckpt-000000120.h5": a checkpoint's file name, by step.
std::string checkpoint_name(int64_t step);
// Whether a file name is one checkpoint_name() writes (ckpt-<digits>.h5).
bool is_checkpoint_name(const std::string& filename);

class CheckpointDir {
 public:
  // warn: report names that look like checkpoints but are not strata's (once each; rank 0).
  CheckpointDir(std::string path, bool warn) : path_(std::move(path)), warn_(warn) {}
  const std::string& path() const { return path_; }

  struct Entry {
    int64_t step;
    std::string name;
  };
  std::vector<Entry> list() const;  // ckpt-*.h5, newest first
  // The step `latest` points at (its file name in *name); nullopt when absent or damaged.
  std::optional<int64_t> latest(std::string* name) const;
  // Replaces `latest` atomically (temporary file, fsync, rename).
  void point_to(const std::string& name) const;
  // Removes all but the newest keep_last checkpoints up to newest_step (newer ones belong to
  // an abandoned lineage: not ours to judge), keeping every keep_every-th by sequence for good
  // (0: none; the shared directory only, a node-local cache is no archive).
  void apply_retention(int64_t newest_step, int64_t keep_last, int64_t keep_every) const;
  // Resume candidates, newest first, up to `latest` (and from `min_step`).
  std::vector<std::string> candidates(int64_t min_step) const;
  int64_t newest_step() const;  // by `latest`, else by name; -1: none

  // The newest checkpoint that verifies (every tensor's CRC): `latest`'s, else the one before
  // it by step, and so on (newer files than `latest` are an unfinished lineage and passed
  // over; damaged ones are passed over and named in `skipped`, not renamed).
  struct Found {
    int64_t step = 0;
    std::string path;
  };
  std::optional<Found> newest_verified(std::vector<std::string>* skipped = nullptr) const;

 private:
  std::string path_;
  bool warn_;
  mutable std::set<std::string> warned_;  // stray names reported once
  mutable std::mutex warned_mu_;          // list() runs on the writer and copier threads too
};

}  // namespace strata
