// An in-process communicator: threads of one process stand in for ranks (as gloo's tests
// spawn them), so that multi-rank code (the grid, pipeline schedules, the gradient allreducer)
// is unit-tested without mpirun. The whole Comm interface, with MPI's semantics:
//  - collectives match by call order on each communicator: every rank must make the same
//    calls in the same order with the same counts and root, or the rank that differs throws
//    std::logic_error naming both calls. Sums and min/max are taken in rank order, so every
//    result equals a serial loop over the ranks' values, run after run.
//  - point-to-point is rendezvous: a send completes when its receive has taken the data (as
//    MPI's large messages do), so code that relies on a send being buffered deadlocks here as
//    it would in production. Messages with the same (from, to, tag) arrive in the order sent;
//    a receive of another count than the send's throws. Tags must lie in [0, 32767] (the
//    least MPI_TAG_UB MPI guarantees).
//  - handles are MPI requests: one that completed tests true until its number is reused.
//  - split: any colors >= 0 and keys, nested to any depth; host names per rank, settable, so
//    tests can simulate nodes; no side channel (nullptr, with the reason).
// Blocking calls sleep on a condition variable (set_yielding_waits changes nothing), and mark
// the watchdog's Activity as MpiComm does.
// Catch2's assertions are not thread-safe: record results inside the ranks, check them after
// run_ranks returns.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.h"

namespace strata {

// The n communicators of a new in-process world: comms[r] is rank r, each used by one thread.
// hosts: each rank's host name; empty: "thread-host" for all (one node).
std::vector<std::unique_ptr<Comm>> make_thread_comms(int n, std::vector<std::string> hosts = {});

struct RanksOptions {
  // After this long the ranks still blocked in the comm are woken with an error and run_ranks
  // throws, saying where each rank waited: a deadlock fails the test instead of hanging it.
  double timeout_s = 60;
  std::vector<std::string> hosts;  // as for make_thread_comms
};

// Runs fn(comm) for ranks 0..n-1 on n threads and joins them. When a rank throws, every rank
// blocked in the comm is woken with an error, and the first exception is rethrown here.
void run_ranks(int n, const std::function<void(Comm&)>& fn, const RanksOptions& opt = {});

}  // namespace strata
