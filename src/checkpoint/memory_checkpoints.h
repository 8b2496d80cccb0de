// Checkpoints in node memory (checkpoint.memory_every, checkpoint.memory_dir): every K steps
// each rank's own part of the run's state goes into its node's memory directory (tmpfs, so it
// outlives the ranks but not the node) and, sent over MPI, into the memory directory of a
// partner rank on another node. A restart inside the allocation resumes from the newest step
// for which every rank's part is in some node's memory (its own copy or the partner's), before
// falling back to checkpoint.dir (docs/checkpoints.md, "Memory checkpoints").
//
// The part's bytes are opaque here (the run packs them: run/memory_state.h). Files in the
// directory, one per part and step:
//   part-<rank>-<step>.own    the part rank <rank> wrote itself
//   part-<rank>-<step>.peer   the copy its partner received and wrote
// each a header (job, attempt, run, ranks, step, CRC-32C) and the payload, written under
// "<name>.tmp.<pid>" and renamed: a half-written copy never has a final name. At most two per
// part and kind, the temporary one included: a rank's saves alternate between two files,
// each renamed to a temporary name, rewritten in place and renamed back under its new step.
// A generation the optimizer's update writes (open_slot) is named for its slot instead,
//   part-<rank>-gen<0|1>.own  its step in its header only
// and keeps that name: while written, its header is marked as being written (a store, not a
// rename on the training thread), and a restart removes such a file as it removes a
// temporary one.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/traffic_gate.h"
#include "strata/comm.h"

namespace strata {

// Ranks paired across nodes: rank r on node n keeps its copy with the rank of the same local
// index on node (n + 1) mod N, and holds the copy of the one on node (n - 1) mod N.
struct MemoryPairing {
  std::vector<int> node_of;             // node index by rank (nodes in order of their first rank)
  std::vector<std::string> node_names;  // by node index
  int partner = -1;                     // keeps this rank's copy (-1: none, one node)
  int source = -1;                      // whose copy this rank keeps (-1: none)
  int local_rank = 0, local_size = 1;   // among the ranks of this rank's node
};
MemoryPairing pair_ranks(const std::vector<std::string>& node_by_rank, int rank);
// Whether every part has holders on two nodes or more, so that their own copies are each
// other's second copy (MemoryCheckpoints::replicated()): ranks passing the same key >= 0 hold
// the same part (the constructor's same_as; -1 a part of its own), node_of their node's index.
bool parts_span_nodes(const std::vector<int64_t>& same_as, const std::vector<int>& node_of);
// A rank's same_as key: data-parallel replicas without ZeRO (not `sharded`) hold the same part,
// that of their stage and tensor part.
inline int64_t memory_part_key(int stage, int tensor, int tensors, bool sharded) {
  return sharded ? -1 : int64_t(stage) * tensors + tensor;
}

// checkpoint.memory_dir as this rank uses it: "" means /dev/shm/strata-<job> ("local-<uid>"
// outside Slurm); every "%n" becomes the node's name.
std::string expand_memory_dir(const std::string& memory_dir);

// A verified copy in this rank's share of its node's memory directory.
struct MemoryCopy {
  int part;
  int64_t step;
  bool own;
  std::string path;
};

// Where a save's `fill` puts the part's bytes, in order: each put() is copied into the mapped
// file and added to the payload's CRC-32C as it passes (checkpoint/crc32c.h: the source is read
// once, while it is still in cache; the file is never read back).
class PartWriter {
 public:
  explicit PartWriter(char* dst, size_t capacity) : dst_(dst), left_(capacity) {}
  void put(const void* src, size_t bytes);
  void zeros(size_t bytes);
  // The payload's CRC-32C.
  uint32_t finish();
  size_t left() const { return left_; }

 private:
  char* dst_;
  size_t left_;
  uint32_t crc_ = ~0u;
};

// The file in `dir` holding `part`'s copy of `step` (own, or a partner's), by its name or, for
// a generation the optimizer's update writes (named for its slot), by its header; empty if
// none. For tests and tools: MemoryCheckpoints::find() is the restore's way.
std::string memory_copy_file(const std::string& dir, int part, int64_t step, bool own);

class MemoryCheckpoints {
 public:
  // Who wrote a copy: a copy of another job, attempt (a requeue) or run is never taken.
  struct Identity {
    std::string job;
    int64_t attempt = 0;
    std::string run;  // the run's config and grid (kept as a hash)
  };
  // Collective. part_floats: this rank's part's size (the same at every save); node: the
  // name of this rank's node (job.h's slurm_node_name(); the tests pass their own).
  // same_as: ranks passing the same key >= 0 hold parts with the same contents at every save
  // (data-parallel replicas without ZeRO); -1: this rank's part is its own. When every part
  // has such replicas on two nodes or more, the replicas' own copies are the second copies:
  // no partner exchange (replicated()).
  MemoryCheckpoints(std::string dir, Comm& comm, int64_t part_floats, Identity id,
                    const std::string& node, int64_t same_as = -1);
  ~MemoryCheckpoints();  // finishes the writes in flight
  MemoryCheckpoints(const MemoryCheckpoints&) = delete;
  MemoryCheckpoints& operator=(const MemoryCheckpoints&) = delete;

  const std::string& dir() const { return dir_; }
  const MemoryPairing& pairing() const { return pair_; }
  // Every part has replicas on another node: no partner copies (pairing() has none).
  bool replicated() const { return replicated_; }
  // ... and every rank holds the same part (data parallelism alone): any replica's newest copy
  // is a whole step of the run (run/update_generations.h writes it in place).
  bool one_part() const { return one_part_; }
  // Collective. Creates the directory and checks that two generations of the parts each node
  // keeps fit both the file system's free space and the node's available memory, with
  // `pinned_per_rank` bytes of each rank's pinned host buffers (a GPU's copies); throws
  // UserError naming the directory and node. Returns the largest node's bytes.
  int64_t preflight(int64_t pinned_per_rank = 0);

  // Collective. The newest step whose every part has a verified copy in the memory directory
  // of some rank's node (damaged copies are named on stderr and removed; copies of an earlier
  // attempt of this job are removed). step -1: none; `why` says what is there.
  struct Found {
    int64_t step = -1;
    int64_t from_partner = 0;  // parts whose own copy is gone: the partner's copy is taken
    int64_t from_replica = 0;  // ... or a copy of a data-parallel replica's part (same_as)
    std::string why;
  };
  Found find();
  // Collective, after find() found a step: this rank's part of it into out (part_floats),
  // from its own node, or sent by the rank whose node holds a copy.
  void take(const Found& f, float* out);

  // A save of `step`, in the background: on the copy thread, `fill(w)` packs this rank's
  // part (part_floats) straight into its file in the memory directory (a mapped tmpfs file,
  // reused every other save: no staging buffer, no page allocation; its CRC as it goes), then
  // the header and the rename that publishes it; on the exchange thread the file's bytes go to the
  // partner and the source's come into the held copy's file. `fill` reads state the training
  // thread leaves alone until fence(). Waits first for the save before the last one to be
  // done with its files (*wait_s), then calls `start(slot)` on this thread (may be empty:
  // a GPU's copies of the state into the slot's host buffer begin there). The saves' slots
  // alternate, 0 and 1; `fill` gets its save's.
  using Fill = std::function<void(PartWriter&, int slot)>;
  void save(int64_t step, const std::function<void(int slot)>& start, Fill fill, double* wait_s);
  // Before the training thread changes the saved state (the optimizer's update): waits for
  // the copies of the saves in flight; returns the seconds waited.
  double fence();

  // The payload's offset in a part file, after its header: 256 bytes, so a payload that the
  // optimizer writes into keeps the flat buffers' alignment.
  static constexpr size_t kPayloadAt = 256;
  // Saves the training thread makes itself, in place of save()'s copy: the optimizer's update
  // writes the next generation straight into a slot's file (run/memory_state.h). Before it
  // writes into `slot`: waits for the slot's exchange (*wait_s), then marks the file's header
  // as being written, so a half-written generation is never taken (on first use, creates and
  // maps it under a temporary name, as `step`'s). The payload (part_floats, 256-byte
  // aligned); null when the file could not be made (warned).
  float* open_slot(int slot, int64_t step, double* wait_s);
  // Whether open_slot(slot) would not wait: no exchange of the slot in flight.
  bool slot_free(int slot) { std::lock_guard<std::mutex> lk(mu_); return busy_[slot] == 0; }
  // The slot's payload holds `step`'s part, with lane sums `sums` (a then b, as
  // strata/lane_sums.h adds them): its header (and its name, the first time), then the
  // partner's copy (in the background where MPI allows). sums null: no part was written, only the exchange goes.
  void publish_slot(int slot, int64_t step, const uint32_t* sums);
  // Waits for the exchange and the writes in flight.
  void drain();
  // The training thread's gate (comm/traffic_gate.h): the exchange posts no piece while it is
  // closed, for `most` at a time (a foreground that never pauses does not starve it). Before
  // the first save.
  struct GateWait {
    const TrafficGate* gate = nullptr;
    std::chrono::microseconds most{0};  // held at most this long before each piece
  };
  void set_gate(const TrafficGate* g, std::chrono::microseconds most = std::chrono::milliseconds(5)) {
    gate_ = {g, most};
  }
  // Whether the run is ending (on an error): a fill waiting for a device gives up.
  bool stopping();
  // Removes the copies this rank wrote (own and held) and the directory if left empty (a run
  // that finished or stopped with a checkpoint in checkpoint.dir no longer needs them).
  void remove_files();
  // Seconds each save spent so far, in save order. On the training thread: waiting for the
  // slot and queueing (queue_s), waking the copy thread (wake_s). Then queued before the copy
  // thread took it (start_s), packing until the state was the training thread's again
  // (fill_s), on the copy thread in all (copy_s: pack, CRC, publish) and on the exchange
  // (partner's send and source's receive; empty without a partner).
  struct Timings {
    std::vector<double> queue_s, wake_s, start_s, fill_s, copy_s, exchange_s;
  };
  Timings timings();

 private:
  // A part file, mapped: the copy of one part at one step, under `path` (its final name once
  // published; while written the temporary name, or for a generation the update writes the
  // name it had, its header marked).
  struct MappedFile {
    int fd = -1;
    char* map = nullptr;
    size_t bytes = 0;
    std::string path;
    // Under the temporary name `tmp`: the file renamed (its pages kept), or on first use
    // created with `bytes` allocated now (a full tmpfs says so here, not as SIGBUS on a write
    // into the mapping) and mapped. 0 or errno; *at: the path that failed.
    int prepare(const std::string& tmp, size_t bytes, std::string* at);
    int rename_to(const std::string& to);  // 0 or errno
    void mark_writing();  // the header says "being written" (a mapped file)
    void close();  // unmaps; the file stays
  };
  struct Save {
    int64_t step;
    int slot;
    Fill fill;
    std::chrono::steady_clock::time_point queued{};
    bool blank = false;  // nothing was saved: the exchange sends zeros (its partner waits)
  };
  using Copy = MemoryCopy;
  void group_parts(int64_t same_as);
  bool pop(std::deque<Save>& q, bool finish, Save* s);
  void copy_loop();
  void exchange_loop();
  void copy_own(const Save& s, std::chrono::steady_clock::time_point t0);
  void exchange(const Save& s);
  void timed_exchange(const Save& s);  // exchange(), its time noted, the slot released
  bool prepare(MappedFile& f, int part, int64_t step, bool own, size_t bytes, bool prune = true);
  bool publish(MappedFile& f, const std::string& name);  // renamed to `name` in dir_ (if not yet)
  void warn(const std::string& path, int err);
  void note_failure(const std::string& path, const std::string& why);
  void done(int slot);

  std::string dir_;
  Comm& comm_;
  int64_t floats_;
  Identity id_;
  uint64_t run_ = 0, job_ = 0;  // id_'s hashes
  MemoryPairing pair_;
  std::vector<int64_t> part_floats_;  // by rank
  std::vector<int> group_;            // by rank: the lowest rank whose part has the same contents
  bool replicated_ = false, one_part_ = false;
  std::vector<int64_t> holder_;       // find(): who provides each part (-1: the part's rank)
  std::map<int, Copy> chosen_;        // find(): by part, the copy this rank would provide
  MappedFile own_[2], held_[2];  // by slot: saves alternate between two generations
  int next_ = 0;                  // the next save's slot
  bool published_ = false;        // publish_slot() published a generation in this launch
  std::unique_ptr<Comm> xcomm_;   // the exchange thread's own communicator
  bool background_exchange_;      // MPI_THREAD_MULTIPLE (or in-process ranks): else inline
  GateWait gate_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Save> copy_q_, exchange_q_;
  int busy_[2] = {0, 0};  // saves in flight per slot
  int uncopied_ = 0;      // saves whose part is not yet copied
  bool stop_ = false;
  std::vector<std::string> failures_;
  Timings timings_;  // under mu_
  std::thread copier_, exchanger_;
};

}  // namespace strata
