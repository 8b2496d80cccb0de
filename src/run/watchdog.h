// Watchdog: finds a rank that stopped making progress and aborts the job naming it (rank and
// host), with exit code kExitHung, instead of letting the job hang until its time limit.
//
// Two failure modes, two detectors, one thread per rank:
//  - the training thread of a rank is stuck outside any collective (a compute or I/O hang):
//    that rank's own watchdog thread sees no progress mark for timeout_s and reports itself;
//  - a whole process stopped (SIGSTOP, a frozen node): its watchdog thread stopped too, so
//    peers notice its heartbeats ceasing for heartbeat_timeout_s (shorter than timeout_s: a
//    silent process is unambiguous, a slow step is not). Every rank's watchdog thread sends heartbeats to
//    rank 0 (rank 0 sends to rank 1) on a duplicated communicator; rank 0 watches every rank
//    and rank 1 watches rank 0. A rank blocked in a collective is "waiting", not stuck: the
//    rank it waits for is the one named. Rank 0 also reports when EVERY rank has been waiting
//    in a collective for timeout_s (a deadlock, or a stalled network).
// Heartbeats need MPI_THREAD_MULTIPLE; without it (or on one rank) only the self-check runs.
//
// Cost on the training thread: each mark is a relaxed atomic store or two (no lock, no
// syscall). Phases that may legitimately take long (checkpoint writing, evaluation) are
// wrapped in Watchdog::Exempt: the self-check ignores them, heartbeats continue.
//
// Test hook: the environment variable STRATA_TEST_HANG, a comma-separated list of
// RANK:STEP[:SECONDS][:exempt|:barrier], makes rank RANK stop inside step_begin(STEP): it
// sleeps forever, or SECONDS seconds, inside an Exempt phase with ":exempt"; ":barrier" makes
// it enter a barrier the other ranks never join (a deadlock: every rank waits). For
// tests/mpi/watchdog.py only; it acts even when the watchdog is off.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/activity.h"

namespace strata {

class Comm;
class SideChannel;

// What a rank was doing, in words ("waiting in MPI_Allreduce", ...), for the error message.
std::string describe_activity(int32_t where, int32_t exempt, const char* exempt_what);

class Watchdog {
 public:
  // Collective over comm's ranks when timeout_s > 0 (gathers host and node names, opens the
  // heartbeat channel, starts the watchdog thread); timeout_s = 0 builds an inactive watchdog.
  // heartbeat_timeout_s: the silence that names a peer (at most timeout_s; 0 = timeout_s).
  // report_path: where the rank that aborts the job first writes one line for scripts
  // (slurm/train.sbatch reads it to exclude the hung rank's node), atomically:
  //   job=ID rank=R node=NODE host=HOST step=S cause=self|heartbeats|deadlock
  // (rank=-1 node=- host=- for a deadlock: no rank is at fault); none after a stop signal
  // (a silent peer is then most likely dead: srun TERMs the others when a rank fails). "" = none.
  Watchdog(Comm& comm, double timeout_s, double heartbeat_timeout_s = 0, std::string report_path = "");
  // stop(); when an exception is unwinding (this rank may be alone in leaving), it leaves
  // without waiting for the other ranks: if they go on, they name this rank after the
  // heartbeat timeout.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The training thread starts step `step`. Hot path: three relaxed stores.
  void step_begin(int64_t step) {
    act_.step.store(step, std::memory_order_relaxed);
    act_.where.store(0, std::memory_order_relaxed);
    act_.bump();
    if (!hangs_.empty()) [[unlikely]] test_hang(step);
  }

  // A phase the self-check ignores (it may take long). RAII, nests, training thread only.
  class Exempt {
   public:
    Exempt(Watchdog& wd, const char* what);  // `what`: a string literal, for messages
    ~Exempt();
    Exempt(const Exempt&) = delete;
    Exempt& operator=(const Exempt&) = delete;

   private:
    Activity& act_;
    const char* prev_;
  };

  // Collective: every rank says goodbye to the ranks watching it, and waits (still watching)
  // for the ranks it watches to say goodbye; then the threads end and the channel is closed.
  // Called by every rank at the end of training (the destructor does it otherwise).
  void stop();

  bool active() const { return detector_.joinable(); }
  // Seconds since the least recent progress of any rank this one watches (rank 0: every rank,
  // by their heartbeats) or of its own training thread; 0 when inactive. Any thread.
  double progress_age_s() const;
  bool heartbeats() const { return channel_ != nullptr; }

  // One STRATA_TEST_HANG entry (the test hook above).
  struct Hang {
    int rank;
    int64_t step;
    double seconds;  // < 0: forever
    enum Mode { kSleep, kExempt, kBarrier } mode;
  };

 private:
  struct Peers;  // what the heartbeat thread has heard (watchdog.cpp)
  void test_hang(int64_t step);
  void detect();     // detector thread: the checks; calls no MPI but MPI_Abort
  void heartbeat();  // heartbeat thread: all side-channel traffic (may block inside MPI)
  // Prints the line, writes the report file naming `rank` (-1: none), aborts the job.
  [[noreturn]] void abort_job(const std::string& line, int rank, const char* cause);
  std::string rank_place(int rank) const;  // "host H" or "host H, node N"
  void write_report(int rank, const char* cause) const;
  void shutdown(bool wait_for_peers);

  Comm& comm_;
  double timeout_s_, silence_s_, check_s_, beat_s_;  // silence_s_: the heartbeat timeout
  double starved_s_ = 0;  // a watchdog thread idle this long was starved (or the process stopped)
  int rank_, size_;
  Activity act_;
  std::vector<Hang> hangs_;
  std::vector<std::string> hosts_, nodes_;  // by rank
  std::string report_path_;
  std::unique_ptr<SideChannel> channel_;
  std::unique_ptr<Peers> peers_;
  std::atomic<int64_t> last_mark_ns_{0};  // detector -> heartbeat: the training thread's last mark
  std::atomic<int64_t> beater_ran_ns_{0};  // heartbeat -> detector: its last pass (it was not starved)
  std::thread detector_, beater_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_requested_ = false;  // under mu_
  bool abandon_ = false;         // under mu_
  bool beater_done_ = false;     // under mu_
};

}  // namespace strata
