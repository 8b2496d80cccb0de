#include "plan/comm_model.h"

#include <stdexcept>

namespace strata {

CommModel CommModel::from_profile(const std::string&) { throw std::logic_error("not yet"); }
CommModel CommModel::from_cluster(const std::string&) { throw std::logic_error("not yet"); }

}  // namespace strata
