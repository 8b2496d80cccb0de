#include "plan/machine_profile.h"

#include <stdexcept>

namespace strata {

MachineProfile read_machine_profile(const std::string&) {
  throw std::logic_error("read_machine_profile: not yet");
}

}  // namespace strata
