// Where a rank's training thread is, for the watchdog: marked by the training thread (and by
// Comm's blocking calls, which say when it waits for other ranks), read by the watchdog
// thread. Its own header so that comm, below the watchdog, can mark it without including it.
#pragma once
#include <atomic>
#include <cstdint>

namespace strata {

// Where the training thread is. Written by the training thread only (relaxed atomics: a
// plain store each), read by the watchdog thread.
struct Activity {
  // `where`: 0 = working since the step began; +op = blocked in op; -op = working since it
  // left op.
  enum Op : int32_t { kAllreduce = 1, kBroadcast, kBarrier, kWait, kShutdown, kNumOps };

  std::atomic<uint64_t> ticks{0};  // changes at every mark: "made progress"
  std::atomic<int64_t> step{-1};
  std::atomic<int32_t> where{0};
  std::atomic<int32_t> exempt{0};  // nesting depth of Exempt phases
  std::atomic<const char*> exempt_what{nullptr};

  void bump() { ticks.store(ticks.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  void enter(Op op) {
    where.store(op, std::memory_order_relaxed);
    bump();
  }
  void leave(Op op) {
    where.store(-op, std::memory_order_relaxed);
    bump();
  }
};

// Marks the scope of a blocking call in which the thread waits for other ranks (a null
// Activity: no marks).
class Blocked {
 public:
  Blocked(Activity* a, Activity::Op op) : a_(a), op_(op) {
    if (a_) a_->enter(op_);
  }
  ~Blocked() {
    if (a_) a_->leave(op_);
  }
  Blocked(const Blocked&) = delete;
  Blocked& operator=(const Blocked&) = delete;

 private:
  Activity* a_;
  Activity::Op op_;
};

}  // namespace strata
