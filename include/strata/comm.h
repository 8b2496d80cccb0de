// Communication seam: the trainer never calls MPI (or, later, NCCL) directly.
// One interface; an MPI implementation and a single-process one (size 1, no MPI calls).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace strata {

struct Activity;  // activity.h: where the training thread is
struct Backend;   // backend.h

// A side channel for the watchdog thread: fixed-size messages on a DUPLICATE of the
// communicator (so they never match training traffic), used by that one thread while the
// training thread runs collectives (needs MPI_THREAD_MULTIPLE). Never blocks.
class SideChannel {
 public:
  virtual ~SideChannel() = default;  // frees the duplicate communicator (call close() first)
  // Sends one message to `to`. If `to` has not taken the last few, this one is dropped (a
  // stopped receiver must not make the sender pile up requests).
  virtual void post(int to, const void* msg) = 0;
  // One received message, if any: copies it to msg, sets *from, returns true.
  virtual bool poll(int* from, void* msg) = 0;
  // Cancels the pending receive and waits up to max_wait_s for sends to complete; sends still
  // pending then are left to complete in the background (MPI_Request_free).
  virtual void close(double max_wait_s) = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place sums over all ranks of this communicator. Deterministic for a fixed size.
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  virtual void allreduce_sum(double* x, int64_t n) = 0;
  virtual void allreduce_sum(int64_t* x, int64_t n) = 0;
  virtual void allreduce_min(int64_t* x, int64_t n) = 0;
  virtual void allreduce_max(double* x, int64_t n) = 0;
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Non-blocking in-place sum. start_* returns a handle; test() drives progress and reports
  // completion; wait() blocks until done. Handles are small integers owned by the Comm: once a
  // test or wait on a handle has reported it complete, its number may be given to a later
  // start (waiting on it again then waits for that one). One thread at a time uses a Comm.
  virtual int start_allreduce_sum(float* x, int64_t n) = 0;
  // Non-blocking collectives of sharded state (ZeRO): x holds sum(counts) floats in the same
  // layout on every rank, rank r's shard at offset counts[0] + ... + counts[r-1]; `counts`
  // (one per rank, >= 0) is the same on every rank. reduce_scatter: on completion this rank's
  // shard holds the sum over ranks of that shard, added in an order fixed for a given size and
  // layout (the in-process comm and MPI: rank order; NCCL: the library's) (the rest of x is then
  // unspecified). allgather: on completion every shard of x holds its owner's values.
  virtual int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& counts) = 0;
  virtual int start_allgather(float* x, const std::vector<int64_t>& counts) = 0;
  // Non-blocking point-to-point transfers of n floats (pipeline activations and their
  // gradients). Messages between two ranks with the same tag arrive in the order sent. The
  // buffer must stay untouched until the handle completes. Waiting for one of these polls
  // (the lowest latency) or, after set_yielding_waits(true), sleeps between polls, so that a
  // rank idle in a pipeline bubble leaves its core to ranks that compute when a node has
  // fewer cores than ranks x threads.
  virtual int start_send(const float* x, int64_t n, int to, int tag) = 0;
  virtual int start_recv(float* x, int64_t n, int from, int tag) = 0;
  virtual bool test(int handle) = 0;
  virtual void wait(int handle) = 0;
  // A one-rank communicator whose sums still run through it (a device communicator asked to
  // run its collectives alone: STRATA_DEVICE_COMM_ONE_RANK, device_comm.h). Callers that skip
  // the sums of a lone rank ask this first.
  virtual bool sums_alone() const { return false; }
  // What carries this communicator's float sums: "mpi", or a device transport's library
  // ("nccl"), for reports (strata bench comm's profile).
  virtual std::string sums_library() const { return "mpi"; }
  void set_yielding_waits(bool on) { yielding_waits_ = on; }

  // Collective: the sub-communicator of the ranks that pass the same color, ordered by key
  // (the process grid's stage and pipeline groups). It shares this Comm's watchdog marks
  // (set_activity), so this Comm must outlive it.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  // Host name of this rank (for error messages naming a rank).
  virtual std::string host() const = 0;
  // The MPI communicator (an MPI_Comm*) for MPI-IO (parallel HDF5 checkpoints); null where
  // this Comm is not one (one process, in-process ranks).
  virtual const void* mpi_handle() const { return nullptr; }
  // Host names of all ranks, indexed by rank. Collective.
  std::vector<std::string> all_hosts() { return all_gather_text(host()); }
  // Every rank's `mine` (at most 255 bytes kept), indexed by rank. Collective.
  virtual std::vector<std::string> all_gather_text(const std::string& mine) = 0;

  // Collective: a side channel of msg_bytes-sized messages (receive: this rank takes
  // messages). nullptr, with the reason in *why_not, where it cannot work: one rank, or MPI
  // without MPI_THREAD_MULTIPLE. Every rank gets the same answer.
  virtual std::unique_ptr<SideChannel> open_side_channel(int msg_bytes, bool receive,
                                                         std::string* why_not) = 0;

  // The watchdog's marks (not owned; nullptr = none): the blocking calls above (allreduce,
  // broadcast, barrier, wait) record that the calling thread waits for other ranks, with two
  // relaxed atomic stores each. Set and cleared by Watchdog.
  void set_activity(Activity* a) { activity_ = a; }

 protected:
  Activity* activity() const { return parent_ ? parent_->activity() : activity_; }
  Activity* activity_ = nullptr;
  const Comm* parent_ = nullptr;  // a split's: the marks are the parent's
  bool yielding_waits_ = false;
};

// Shards of a buffer of n floats over `ranks`: contiguous, in rank order, each starting at a
// multiple of 16 floats (64 bytes: whole cache lines and vectors), the last taking what is
// left; with fewer than 16 per rank some are empty. ZeRO's shards (parallel/zero.h) and the
// MPI allreduce's reduce-scatter.
std::vector<int64_t> cache_line_shards(int64_t n, int ranks);

// MPI_COMM_WORLD-based comm (MPI must be initialised); single-rank comm otherwise.
std::unique_ptr<Comm> make_world_comm();
std::unique_ptr<Comm> make_single_comm();
// The communicator for a backend whose memory is not the host's: float data (allreduce_sum
// of floats, start_allreduce_sum, the sharded collectives, start_send/recv) is then in that
// memory. The sums run on the device's transport (device_comm.h: NCCL on a GPU, bootstrapped
// over `host`; the staged stand-in on cpu-staged) on a stream of their own, overlapping
// backward; pipeline sends and receives are staged through host memory over `host` (MPI).
// Everything else goes to `host`. Collective over `host`. On a host-memory backend, `host`
// itself. (src/backends/device_comm.cpp)
std::unique_ptr<Comm> make_device_comm(std::unique_ptr<Comm> host, const Backend& be);

// Runs fn on every rank of comm; if it throws UserError on any rank, the lowest such rank
// throws its error (its message is the one printed) and every other rank throws an
// AgreedFailure with the same exit code, so no rank is left waiting in a later collective.
void collectively(Comm& comm, const std::function<void()>& fn);

// MPI life cycle: init asking for MPI_THREAD_MULTIPLE (the watchdog's heartbeat thread calls
// MPI while the training thread does); whatever level MPI grants is accepted, and
// open_side_channel says when it is too low. Safe when launched without mpirun (MPI
// singleton). finalize is idempotent.
void mpi_init(int* argc, char*** argv);
// The thread level MPI granted ("MPI_THREAD_MULTIPLE", ...); "none" before mpi_init.
std::string mpi_thread_level();
void mpi_finalize();
[[noreturn]] void mpi_abort(int code);

}  // namespace strata
