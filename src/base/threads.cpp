#include "base/threads.h"

#include <pthread.h>
#include <sched.h>

namespace strata {

bool run_at_idle_priority() {
#if defined(__linux__) && defined(SCHED_IDLE)
  sched_param p{};
  p.sched_priority = 0;
  return pthread_setschedparam(pthread_self(), SCHED_IDLE, &p) == 0;
#else
  return false;
#endif
}

}  // namespace strata
