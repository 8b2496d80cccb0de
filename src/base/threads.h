// Threads that work beside the training thread (memory checkpoints' copy and exchange).
#pragma once

namespace strata {

// The calling thread runs only on a core that no other thread of normal priority wants (Linux
// SCHED_IDLE). A background thread of normal priority that a condition variable wakes takes
// the waker's core at once when the scheduler puts it there: the training thread's notify of
// a memory checkpoint then lasted as long as the copy it started (1-2.5 ms per save, measured
// on 2 ranks of 2 cores). At idle priority it runs on a spare core, or when the training
// thread waits. Returns false (and leaves the thread as it was) where that is not possible.
bool run_at_idle_priority();

}  // namespace strata
