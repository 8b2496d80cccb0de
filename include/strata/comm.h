// Communication seam: the trainer never calls MPI (or, later, NCCL) directly.
// One interface; an MPI implementation and a single-process one (size 1, no MPI calls).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

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
  // completion; wait() blocks until done. Handles are small integers owned by the Comm.
  virtual int start_allreduce_sum(float* x, int64_t n) = 0;
  virtual bool test(int handle) = 0;
  virtual void wait(int handle) = 0;

  // Host name of this rank (for error messages naming a rank).
  virtual std::string host() const = 0;
};

// MPI_COMM_WORLD-based comm (MPI must be initialised); single-rank comm otherwise.
std::unique_ptr<Comm> make_world_comm();
std::unique_ptr<Comm> make_single_comm();

// MPI life cycle: init with thread support FUNNELED; safe when launched without mpirun
// (MPI singleton). finalize is idempotent.
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
[[noreturn]] void mpi_abort(int code);

}  // namespace strata
