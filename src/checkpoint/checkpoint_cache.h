// The node-local checkpoint cache (checkpoint.local_dir, off by default).
//
// Rank 0 writes each checkpoint into <local_dir>/strata-<id>/ on its node (a fast local disk:
// the training thread waits only for that write, or for its snapshot when checkpoint.async),
// and a SharedCopier thread copies it to checkpoint.dir with the same atomic publication as a
// direct write: temporary name, fsync, CRC-32 of the bytes read back against those copied,
// rename, then the shared `latest`. <id> comes from checkpoint.dir/cache-id, made by the first
// run that uses the cache, so copies left in a local directory by another run are never taken
// for this one's. Resume (checkpointer.cpp) prefers a verified local copy at least as new as
// the shared `latest`, on whichever node holds it, and copies it to the shared directory when
// it is newer.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace strata {

// checkpoint.local_dir with every "%n" replaced by this rank's node name (job.h).
std::string expand_local_dir(const std::string& local_dir);

// Copies `src` to the new file `dst` (in the shared directory), fsyncs it, evicts it from the
// page cache and reads it back: "" when the CRC-32 read back equals the one copied, else why
// not (dst is then removed). *bytes gets the size.
std::string copy_verified(const std::string& src, const std::string& dst, int64_t* bytes);

// Copies checkpoints from the local cache to the shared directory on a thread of its own,
// one at a time. A checkpoint submitted while a copy runs waits, replacing any that was
// waiting already: the shared directory may skip checkpoints, training never waits for it.
class SharedCopier {
 public:
  // publish(name, step) runs on the copier thread once shared_dir/name is in place (moves
  // the shared `latest`, applies retention); it may throw UserError.
  using Publish = std::function<void(const std::string& name, int64_t step)>;
  SharedCopier(std::string shared_dir, Publish publish);
  ~SharedCopier();  // finishes the copy in flight and the one waiting
  SharedCopier(const SharedCopier&) = delete;
  SharedCopier& operator=(const SharedCopier&) = delete;

  void submit(const std::string& local_path, const std::string& name, int64_t step);
  // Blocks until no copy waits or runs; returns the failures not yet taken.
  std::vector<std::string> drain();
  std::vector<std::string> take_failures();
  double last_copy_s() const;  // the newest finished copy's time (0 before the first)

 private:
  struct Job {
    std::string local_path, name;
    int64_t step;
  };
  void run();
  void copy(const Job& job);

  std::string shared_;
  Publish publish_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> waiting_;
  bool busy_ = false, stop_ = false;
  std::vector<std::string> failures_;
  double last_copy_s_ = 0;
  std::thread thread_;
};

}  // namespace strata
