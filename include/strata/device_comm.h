// The device communicator's seam: what a communicator over device memory needs from a device.
// One communicator (src/backends/device_comm.cpp) holds the logic every device shares: which transfers
// go to the device's collectives and which are staged through host memory over MPI, when the
// collectives' stream waits for the compute stream and the other way round, how handles are
// polled and completed. A device supplies a DeviceTransport: on a GPU, NCCL on a stream of its
// own with CUDA events (src/backends/cuda); on --device cpu-staged, a stand-in whose "streams" are
// deferred queues and whose collectives are MPI on the staged memory (src/backends/staged_device.cpp),
// so that the communicator's logic runs in CI and only NCCL's own calls are left for a GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace strata {

class Comm;

class DeviceTransport {
 public:
  using Event = int;  // the transport's events, small integers it owns
  virtual ~DeviceTransport() = default;

  // Whether this transport runs collectives on device memory. False where two ranks of the
  // communicator share one device (NCCL refuses to form such a communicator): then the
  // communicator stages its sums through host memory over the host comm instead.
  virtual bool collectives() const = 0;
  // The library those collectives use, for reports: NCCL's says "nccl"; the staged stand-in's
  // are MPI's.
  virtual const char* library() const { return "mpi"; }

  // Events order the compute stream (the backend's ops) and the collectives' stream.
  virtual Event new_event() = 0;
  virtual void record_on_compute(Event e) = 0;   // e := the compute stream's work issued so far
  virtual void record_on_comm(Event e) = 0;      // e := the collectives' stream's work so far
  virtual void comm_waits(Event e) = 0;          // later collectives wait for e
  virtual void compute_waits(Event e) = 0;       // later compute ops wait for e
  // Whether e has completed; throws when the device reports an error. Never blocks.
  virtual bool query(Event e) = 0;
  // Throws when the collectives failed asynchronously (a lost peer: NCCL reports it only when
  // asked); the communicator asks every so often while it waits.
  virtual void check_async_error() = 0;

  // Collectives on the collectives' stream, in place, over device memory (see Comm's
  // start_allreduce_sum and start_reduce_scatter_sum / start_allgather for the contracts).
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  virtual void sharded(float* x, const std::vector<int64_t>& counts, bool reduce) = 0;

  // Called by the communicator's destructor when a collective may still be in flight (an
  // exception unwinding past it, a failed peer): give the device's resources back without
  // waiting for it.
  virtual void abandon() = 0;
};

// The transports: cuda_transport (backend.h: NCCL, in the CUDA module) and staged_transport
// (staged_device.h). STRATA_DEVICE_COMM_ONE_RANK=1 asks them for the device's collectives on a
// one-rank communicator too (NCCL on one GPU: its calls, streams and events run where a node
// has a single GPU); a transport reads it with this.
bool device_collectives_on_one_rank();

}  // namespace strata
