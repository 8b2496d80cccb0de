// The list of backend providers (provider.h): the one place that names them all.
#include "backends/provider.h"

#include <cstring>
#include <stdexcept>

namespace strata {

extern const BackendProvider kCudaProvider;    // cuda_provider.cpp
extern const BackendProvider kCpuProvider;     // cpu_provider.cpp
extern const BackendProvider kStagedProvider;  // staged_device.cpp

const std::vector<const BackendProvider*>& backend_providers() {
  static const std::vector<const BackendProvider*> all = {&kCudaProvider, &kCpuProvider,
                                                          &kStagedProvider};
  return all;
}

const BackendProvider& provider_of(const Backend& be) {
  for (const BackendProvider* p : backend_providers())
    if (std::strcmp(p->name, be.name) == 0) return *p;
  throw std::logic_error(std::string("provider_of: no provider named ") + be.name);
}

}  // namespace strata
