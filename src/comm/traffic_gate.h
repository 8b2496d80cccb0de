// Background transfers yield to the training thread's collectives.
//
// The memory checkpoints' partner exchange (checkpoint/memory_checkpoints.h) moves a rank's
// whole state every save over the same link as the gradient sums: between two ranks of a node
// MPI's shared-memory queue, across nodes the same NIC. Messages leave in order, so a sum
// started behind a few megabytes of checkpoint waits for all of them. Gemini (SOSP '23) puts
// checkpoint traffic in the training traffic's idle time; here the training thread closes the
// gate while its sums are in flight (GradientAllreducer), and the exchange posts no new piece
// until it opens. On a 16-core host the MLP's 0.84 ms step cost +80.6 % with a save every step
// before the gate, +39.5 % with it (benchmarks/RESULTS.md, run 12).
#pragma once
#include <atomic>
#include <chrono>
#include <thread>

namespace strata {

class TrafficGate {
 public:
  // The training thread: its collectives start, and are done. Nested closes count.
  void close() { closed_.fetch_add(1, std::memory_order_release); }
  void open() { closed_.fetch_sub(1, std::memory_order_release); }
  bool is_open() const { return closed_.load(std::memory_order_acquire) == 0; }

  // The background thread: waits while the gate is closed, at most `most` (a foreground that
  // never pauses must not starve the checkpoint), or until `give_up()` says to stop.
  template <class GiveUp>
  void wait_open(std::chrono::microseconds most, GiveUp give_up) const {
    const auto until = std::chrono::steady_clock::now() + most;
    while (!is_open() && std::chrono::steady_clock::now() < until && !give_up())
      std::this_thread::sleep_for(std::chrono::microseconds(10));
  }

 private:
  std::atomic<int> closed_{0};
};

// Closes a gate for a scope (an all-gather); a null gate is no gate.
class GateClosed {
 public:
  explicit GateClosed(TrafficGate* g) : g_(g) {
    if (g_) g_->close();
  }
  ~GateClosed() {
    if (g_) g_->open();
  }
  GateClosed(const GateClosed&) = delete;
  GateClosed& operator=(const GateClosed&) = delete;

 private:
  TrafficGate* g_;
};

}  // namespace strata
