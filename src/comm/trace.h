// Per-rank timeline of a few training steps, written as one Chrome trace JSON file merged over
// ranks (chrome://tracing, ui.perfetto.dev), so a user can see the pipeline bubble.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/comm.h"

namespace strata {

// Records spans of a few training steps on this rank: compute, send, receive, allreduce,
// idle, optimizer, data. Recording costs one clock read per span edge and one vector push.
class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  // Memory bound: spans past this many on one rank are dropped (and counted in the row's label).
  static constexpr int64_t kMaxSpans = 1'000'000;

  Tracer() = default;  // disabled: every call is a cheap no-op
  // Records steps [first_step, first_step + steps); steps <= 0 gives a disabled tracer.
  Tracer(int64_t first_step, int64_t steps);
  bool enabled() const { return steps_ > 0; }
  // Sets t = 0 for this rank. Call on every rank right after a barrier on the world comm, so
  // timelines of different ranks (and nodes) line up to within the barrier's exit skew.
  // (Until then t = 0 is the construction time.)
  void set_origin();
  // Whether spans are recorded during `step` (the trainer calls it at each step's start).
  void begin_step(int64_t step);
  bool recording() const { return recording_; }
  // One span; cat is one of "compute", "send", "receive", "allreduce", "idle", "optimizer",
  // "data" and must be a string literal (the pointer is kept). `micro` = micro-batch index or
  // -1. Ignored unless recording().
  void span(const char* cat, const std::string& name, Clock::time_point t0, Clock::time_point t1,
            int micro = -1);

  // RAII span: records [construction, destruction). Reads no clock unless recording() at
  // construction.
  class Scope {
   public:
    Scope(Tracer& t, const char* cat, std::string name, int micro = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* t_;  // nullptr: not recording
    const char* cat_;
    std::string name_;
    int micro_;
    Clock::time_point t0_;
  };

  // Collective over `world`: every rank's spans go to rank 0, which writes the merged JSON to
  // `path` atomically (write PATH.tmp then rename). `label` names this rank's row, e.g.
  // "rank 1 · stage 1 · replica 0 · host n2". Returns the number of events written (rank 0;
  // the spans, not counting the two metadata events per rank), 0 elsewhere. Throws UserError
  // (strata/error.h, fail_input) naming the path if it cannot be written; the other ranks then
  // throw AgreedFailure, so no rank goes on to a collective rank 0 has left. A disabled
  // tracer returns 0 with no communication: enabled() must be the same on every rank.
  int64_t write(Comm& world, const std::string& path, const std::string& label);

 private:
  struct Span {
    const char* cat;
    std::string name;
    Clock::time_point t0, t1;
    int64_t step;
    int micro;
  };
  std::string events_json(int rank, const std::string& label) const;

  int64_t first_ = 0, steps_ = 0, step_ = -1;
  bool recording_ = false;
  Clock::time_point origin_{};
  std::vector<Span> spans_;
  int64_t dropped_ = 0;
};

}  // namespace strata
