// collectively(): agreeing on a failure before any rank goes on (comm.h).
#include <climits>

#include "strata/comm.h"
#include "strata/error.h"

namespace strata {

void collectively(Comm& comm, const std::function<void()>& fn) {
  int64_t code = 0;
  std::string msg;
  try {
    fn();
  } catch (const UserError& e) {
    code = e.code;
    msg = e.what();
  }
  int64_t v[2] = {code ? comm.rank() : INT_MAX, code ? -code : 0};  // lowest failing rank, code
  comm.allreduce_min(v, 2);
  if (v[0] == INT_MAX) return;
  if (comm.rank() == v[0]) throw UserError(int(code), msg);
  throw AgreedFailure(int(-v[1]), "");
}

}  // namespace strata
