#include "run/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "base/files.h"
#include "base/job.h"
#include "base/parse.h"
#include "strata/comm.h"
#include "strata/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
Clock::duration dur(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// One heartbeat: what the sender's training thread is doing, as its watchdog thread sees it.
struct Beat {
  int64_t step;
  double quiet_s;  // seconds since the training thread's last mark
  int32_t where;   // Activity::where
  int32_t exempt;  // Activity::exempt
  int32_t bye;     // 1: the sender has stopped its watchdog; no more heartbeats follow
  char what[36];   // the exempt phase's name
};
static_assert(std::is_trivially_copyable_v<Beat>);

const char* op_name(int32_t op) {
  switch (op) {
    case Activity::kAllreduce: return "MPI_Allreduce";
    case Activity::kBroadcast: return "MPI_Bcast";
    case Activity::kBarrier: return "MPI_Barrier";
    case Activity::kWait: return "MPI_Wait on a gradient allreduce";
    case Activity::kShutdown: return "the watchdog's shutdown at the end of training";
    default: return "an unknown call";
  }
}

std::string step_text(int64_t step) {
  return step < 0 ? std::string("before the first step") : fmt::format("in step {}", step);
}

std::string seconds_text(double s) { return s < 10 ? fmt::format("{:.1f}", s) : fmt::format("{:.0f}", s); }

// STRATA_TEST_HANG's entries for rank `rank` (the header says the format). Every rank reads
// the same variable: rank 0 reports a bad entry, the others leave with it.
std::vector<Watchdog::Hang> test_hangs(int rank) {
  using Hang = Watchdog::Hang;
  std::vector<Hang> hangs;
  const char* env = std::getenv("STRATA_TEST_HANG");
  if (!env || !*env) return hangs;
  const std::string spec = env;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    std::vector<std::string> f;
    for (size_t a = 0; a <= item.size();) {
      const size_t b = std::min(item.find(':', a), item.size());
      f.push_back(item.substr(a, b - a));
      a = b + 1;
    }
    Hang h{-1, -1, -1.0, Hang::kSleep};
    bool ok = f.size() >= 2 && f.size() <= 4;
    std::string why;
    std::optional<int64_t> r, st;
    if (ok) r = parse_int(f[0], &why), st = parse_int(f[1], &why);
    ok = ok && r && st && *r < (1 << 24);
    if (ok) h.rank = int(*r), h.step = *st;
    for (size_t i = 2; ok && i < f.size(); ++i) {
      if (f[i] == "exempt") h.mode = Hang::kExempt;
      else if (f[i] == "barrier") h.mode = Hang::kBarrier;
      else if (auto sec = parse_real(f[i], &why); i == 2 && sec && *sec >= 0) h.seconds = *sec;
      else ok = false;
    }
    if (!ok || h.rank < 0 || h.step < 0) {
      const std::string msg = fmt::format(
          "STRATA_TEST_HANG: '{}' is not RANK:STEP[:SECONDS][:exempt|:barrier] (a test hook)", item);
      if (rank == 0) throw UserError(kExitBadInput, msg);
      throw AgreedFailure(kExitBadInput, "");
    }
    if (h.rank == rank) hangs.push_back(h);
  }
  return hangs;
}

}  // namespace

struct Watchdog::Peers {
  struct Peer {
    Clock::time_point heard, bye_at;
    Beat beat{};
    bool seen = false, bye = false;
  };
  std::mutex mu;                      // the heartbeat thread writes, the detector reads
  std::vector<Peer> v;                // by rank
  std::vector<int> watched, watchers;  // ranks this one watches / that watch this one
};

std::string describe_activity(int32_t where, int32_t exempt, const char* what) {
  if (exempt > 0) return fmt::format("in an exempt phase: {}", what && *what ? what : "unnamed");
  if (where > 0) return fmt::format("waiting in {}", op_name(where));
  if (where == 0) return "busy since the step began, outside any collective";
  return fmt::format("busy since it left {}, outside any collective", op_name(-where));
}

Watchdog::Watchdog(Comm& comm, double timeout_s, double heartbeat_timeout_s, std::string report_path)
    : comm_(comm), timeout_s_(timeout_s),
      silence_s_(heartbeat_timeout_s > 0 ? std::min(heartbeat_timeout_s, timeout_s) : timeout_s),
      rank_(comm.rank()), size_(comm.size()), report_path_(std::move(report_path)) {
  hangs_ = test_hangs(rank_);
  if (timeout_s_ <= 0) return;
  // Check every 1/8 of the shorter timeout (at most 1 s), heartbeat every silence/4 (at most
  // 2 s): at least four beats go missing before a peer is named.
  check_s_ = std::clamp(silence_s_ / 8, 0.01, 1.0);
  beat_s_ = std::clamp(silence_s_ / 4, 0.02, 2.0);
  starved_s_ = std::max(silence_s_ / 2, 4 * check_s_);
  comm_.set_activity(&act_);
  hosts_ = comm_.all_hosts();
  nodes_ = comm_.all_gather_text(slurm_node_name());
  std::string why_not;
  channel_ = comm_.open_side_channel(int(sizeof(Beat)), /*receive=*/rank_ <= 1, &why_not);
  if (!channel_ && size_ > 1 && rank_ == 0)
    fmt::print(stderr, "strata: warning: watchdog: {}: each rank checks only itself; a stopped "
               "process is not detected\n", why_not);
  peers_ = std::make_unique<Peers>();
  const auto now = Clock::now();
  peers_->v.assign(size_t(size_), Peers::Peer{now, now});
  if (channel_) {
    if (rank_ == 0)
      for (int r = 1; r < size_; ++r) peers_->watched.push_back(r);
    if (rank_ == 1) peers_->watched.push_back(0);
    peers_->watchers.push_back(rank_ == 0 ? 1 : 0);
    beater_ = std::thread([this] { heartbeat(); });
  } else {
    beater_done_ = true;
  }
  detector_ = std::thread([this] { detect(); });
}

Watchdog::~Watchdog() {
  // While an exception unwinds, the other ranks may be elsewhere: do not wait for them.
  shutdown(/*wait_for_peers=*/std::uncaught_exceptions() == 0);
}

void Watchdog::stop() { shutdown(true); }

void Watchdog::shutdown(bool wait_for_peers) {
  if (detector_.joinable()) {
    act_.enter(Activity::kShutdown);
    {
      std::lock_guard lk(mu_);
      (wait_for_peers ? stop_requested_ : abandon_) = true;
    }
    cv_.notify_all();
    if (beater_.joinable()) beater_.join();  // it sets beater_done_; the detector then ends
    detector_.join();
  }
  if (timeout_s_ > 0) comm_.set_activity(nullptr);
  // Freeing the communicator is collective: only when every rank is here too.
  if (wait_for_peers) channel_.reset();
  else (void)channel_.release();  // left to MPI_Finalize
}

Watchdog::Exempt::Exempt(Watchdog& wd, const char* what)
    : act_(wd.act_), prev_(act_.exempt_what.load(std::memory_order_relaxed)) {
  act_.exempt_what.store(what, std::memory_order_relaxed);
  act_.exempt.store(act_.exempt.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  act_.bump();
}

Watchdog::Exempt::~Exempt() {
  act_.exempt.store(act_.exempt.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  act_.exempt_what.store(prev_, std::memory_order_relaxed);
  act_.bump();
}

void Watchdog::test_hang(int64_t step) {
  for (const Hang& h : hangs_) {
    if (h.step != step) continue;
    if (h.mode == Hang::kBarrier) {
      // A collective the other ranks do not join: every rank ends up waiting (a deadlock).
      comm_.barrier();
      continue;
    }
    std::optional<Exempt> ex;
    if (h.mode == Hang::kExempt) ex.emplace(*this, "test hook STRATA_TEST_HANG");
    if (h.seconds < 0)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    std::this_thread::sleep_for(std::chrono::duration<double>(h.seconds));
  }
}

std::string Watchdog::rank_place(int rank) const {
  const std::string& h = hosts_.at(size_t(rank));
  const std::string& n = nodes_.at(size_t(rank));
  return n == h ? fmt::format("host {}", h) : fmt::format("host {}, node {}", h, n);
}

void Watchdog::write_report(int rank, const char* cause) const {
  // After a stop signal (srun's TERM when another rank died, scancel) a silent peer is most
  // likely dead, not hung: its node is not to be blamed.
  if (report_path_.empty() || stop_signal() != 0) return;
  // Names only: node and host names were checked (job.cpp) or come from gethostname.
  const std::string job = slurm_job_id();
  const std::string line = fmt::format(
      "job={} rank={} node={} host={} step={} cause={}\n", job.empty() ? "-" : job, rank,
      rank < 0 ? "-" : nodes_.at(size_t(rank)), rank < 0 ? "-" : hosts_.at(size_t(rank)),
      act_.step.load(std::memory_order_relaxed), cause);
  (void)replace_text_file(report_path_, line);  // if it fails, the error line still names the rank
}

double Watchdog::progress_age_s() const {
  if (!peers_) return 0;
  const auto now = Clock::now();
  const int64_t mark = last_mark_ns_.load(std::memory_order_relaxed);
  double age = mark ? secs(now.time_since_epoch() - std::chrono::nanoseconds(mark)) : 0.0;
  std::lock_guard lk(peers_->mu);
  for (int r : peers_->watched) {
    const Peers::Peer& p = peers_->v[size_t(r)];
    if (p.seen && !p.bye) age = std::max(age, p.beat.quiet_s + secs(now - p.heard));
  }
  return age;
}

void Watchdog::abort_job(const std::string& line, int rank, const char* cause) {
  write_report(rank, cause);
  fmt::print(stderr, "strata: error: watchdog: {}; aborting the job\n", line);
  std::fflush(stderr);
  // MPI_Abort could itself wait on a lock a stuck MPI call holds: exit anyway after a while
  // (the launcher then ends the job: a rank exited with a non-zero code).
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(kExitHung);
  }).detach();
  mpi_abort(kExitHung);
}

void Watchdog::heartbeat() {
  bool abandoned = false;
  try {
    Peers& P = *peers_;
    auto next_beat = Clock::now();
    bool bye_sent = false;
    for (;;) {
      bool stopping = false;
      {
        std::unique_lock lk(mu_);
        stopping = stop_requested_;
        abandoned = abandon_;
      }
      if (abandoned) break;
      const auto now = Clock::now();
      Beat in{};
      int from = -1;
      while (channel_->poll(&from, &in)) {
        std::lock_guard lk(P.mu);
        Peers::Peer& p = P.v.at(size_t(from));
        p.heard = now;
        p.beat = in;
        p.seen = true;
        if (in.bye && !p.bye) p.bye = true, p.bye_at = now;
      }
      // After the queue is drained: a fresh stamp means every beat sent before `now` was read.
      beater_ran_ns_.store(std::chrono::nanoseconds(now.time_since_epoch()).count(),
                           std::memory_order_release);
      if (!bye_sent && (stopping || now >= next_beat)) {
        Beat b{};
        b.step = act_.step.load(std::memory_order_relaxed);
        const int64_t mark = last_mark_ns_.load(std::memory_order_relaxed);
        b.quiet_s = mark ? secs(now.time_since_epoch() - std::chrono::nanoseconds(mark)) : 0.0;
        b.where = act_.where.load(std::memory_order_relaxed);
        b.exempt = act_.exempt.load(std::memory_order_relaxed);
        b.bye = stopping;
        if (const char* w = act_.exempt_what.load(std::memory_order_relaxed))
          std::strncpy(b.what, w, sizeof b.what - 1);
        for (int r : P.watchers) channel_->post(r, &b);
        bye_sent = stopping;
        next_beat = now + dur(beat_s_);
      }
      if (bye_sent) {
        std::lock_guard lk(P.mu);
        if (std::all_of(P.watched.begin(), P.watched.end(), [&](int r) { return P.v[size_t(r)].bye; }))
          break;
      }
      std::unique_lock lk(mu_);
      if (stop_requested_ || abandon_) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      } else {
        cv_.wait_for(lk, dur(std::min(check_s_, beat_s_)), [&] { return stop_requested_ || abandon_; });
      }
    }
    channel_->close(abandoned ? 0.0 : timeout_s_);
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: internal error on rank {} ({}): watchdog heartbeats: {}\n", rank_,
               comm_.host(), e.what());
    std::fflush(stderr);
    mpi_abort(kExitInternal);
  }
  {
    std::lock_guard lk(mu_);
    beater_done_ = true;
  }
  cv_.notify_all();
}

void Watchdog::detect() {
  Peers& P = *peers_;
  auto now = Clock::now();
  auto last_iter = now;
  auto last_mark = now;  // the training thread's last mark (tick change)
  auto last_ok = now;    // ... or last seen waiting in a collective or in an exempt phase
  uint64_t last_ticks = act_.ticks.load(std::memory_order_relaxed);
  last_mark_ns_.store(std::chrono::nanoseconds(now.time_since_epoch()).count(), std::memory_order_relaxed);
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, dur(check_s_), [&] { return abandon_ || (stop_requested_ && beater_done_); });
      if (abandon_ || (stop_requested_ && beater_done_)) return;
    }
    now = Clock::now();
    const auto gap = now - last_iter;
    last_iter = now;
    if (secs(gap) > starved_s_) {
      // This thread did not run for a while: the process was stopped and continued (^Z,
      // a debugger) or starved of CPU. That time is no rank's fault here; peers judge it.
      const auto shift = gap - dur(check_s_);
      last_mark += shift;
      last_ok += shift;
      std::lock_guard lk(P.mu);
      for (auto& p : P.v) p.heard += shift, p.bye_at += shift;
    }

    // Self-check: the training thread busy, outside collectives and exempt phases, with no
    // mark for timeout_s. A sample that sees it waiting or exempt resets the clock, so a
    // mark racing with the sample cannot raise a false alarm.
    const int32_t where = act_.where.load(std::memory_order_relaxed);
    const int32_t exempt = act_.exempt.load(std::memory_order_relaxed);
    const uint64_t ticks = act_.ticks.load(std::memory_order_relaxed);
    if (ticks != last_ticks) {
      last_ticks = ticks;
      last_mark = last_ok = now;
      last_mark_ns_.store(std::chrono::nanoseconds(now.time_since_epoch()).count(),
                          std::memory_order_relaxed);
    }
    if (where > 0 || exempt > 0) last_ok = now;
    if (secs(now - last_ok) > timeout_s_)
      abort_job(fmt::format("rank {} ({}) made no progress for {} s {} ({}; its own watchdog "
                            "noticed)", rank_, rank_place(rank_), seconds_text(secs(now - last_ok)),
                            step_text(act_.step.load(std::memory_order_relaxed)),
                            describe_activity(where, exempt, nullptr)),
                rank_, "self");
    if (!channel_) continue;

    // A silence is judged only while this rank's own heartbeat thread runs: if it was starved
    // of CPU, beats may wait unread in MPI's queue.
    const int64_t ran = beater_ran_ns_.load(std::memory_order_acquire);
    const bool listening = secs(now.time_since_epoch() - std::chrono::nanoseconds(ran)) < starved_s_;
    // After a stop signal (srun TERMs the other ranks when one dies) a silent peer is most
    // likely gone: only the long timeout names it then.
    const double silence = stop_signal() != 0 ? timeout_s_ : silence_s_;
    std::string verdict;
    int culprit = -1;
    const char* cause = "deadlock";
    {
      std::lock_guard lk(P.mu);
      for (int r : P.watched) {
        const Peers::Peer& p = P.v[size_t(r)];
        if (!listening || p.bye || secs(now - p.heard) <= silence) continue;
        // Heartbeats are periodic: the last one may be several steps old. The step the rank
        // is stuck in is the one its peers wait in (collectives keep ranks within a step).
        const int64_t mine = act_.step.load(std::memory_order_relaxed);
        culprit = r;
        cause = "heartbeats";
        verdict = fmt::format(
            "rank {} ({}) made no progress for {} s {} (its heartbeats stopped: the process "
            "was stopped or killed, or its node froze; {}; noticed by rank {})",
            r, rank_place(r), seconds_text(secs(now - p.heard)), step_text(mine),
            p.seen ? fmt::format("its last heartbeat ({}) said: {}", step_text(p.beat.step),
                                 describe_activity(p.beat.where, p.beat.exempt, p.beat.what))
                   : std::string("no heartbeat ever arrived"),
            rank_);
        break;
      }
      if (verdict.empty() && rank_ == 0) {
        // Every rank waiting in a collective, none with a mark for timeout_s: no rank is
        // stuck on its own, yet none moves (a deadlock between ranks, or a stalled network).
        bool all = exempt == 0 && where > 0 && secs(now - last_mark) > timeout_s_;
        double least = secs(now - last_mark);
        std::string list = fmt::format("rank 0 {} {}", describe_activity(where, 0, nullptr),
                                       step_text(act_.step.load(std::memory_order_relaxed)));
        for (int r = 1; all && r < size_; ++r) {
          const Peers::Peer& p = P.v[size_t(r)];
          const bool waiting = p.seen && (p.bye || (p.beat.where > 0 && p.beat.exempt == 0));
          const double q = p.bye ? secs(now - p.bye_at) : p.beat.quiet_s + secs(now - p.heard);
          all = waiting && q > timeout_s_;
          least = std::min(least, q);
          if (r < 4)
            list += fmt::format(", rank {} {}", r,
                                p.bye ? std::string("done, in the watchdog's shutdown")
                                      : describe_activity(p.beat.where, 0, nullptr) + " " +
                                            step_text(p.beat.step));
        }
        if (all)
          verdict = fmt::format("no rank made progress for {} s, every one waiting for another "
                                "({}{}): a deadlock between ranks, or the network stopped",
                                seconds_text(least), list, size_ > 4 ? ", ..." : "");
      }
    }
    if (!verdict.empty()) abort_job(verdict, culprit, cause);
  }
}

}  // namespace strata
