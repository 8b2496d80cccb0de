// The entry point of the CUDA backend module (libstrata_cuda.so): the one exported symbol,
// a table of the seam's functions defined in this directory (see cuda_module.h). Every other
// symbol of the module is local (cuda_module.map), so these names never bind to the
// executable's forwarding functions of the same name (src/backends/cuda_loader).
#include "backends/cuda_api.h"
#include "strata/comm.h"
#include "strata/cuda_module.h"
#include "strata/device_comm.h"
#include "strata/version.h"

#include <string>

extern "C" const strata::CudaModule* strata_cuda_module() {
  static const std::string build = std::string(STRATA_VERSION " ") + strata::git_commit();
  static const strata::CudaModule m{
      .build = build.c_str(),
      .backend_size = sizeof(strata::Backend),
      .devices = strata::cuda_devices,
      .backend = strata::cuda_backend,
      .device_name = strata::cuda_device_name,
      .transport = strata::cuda_transport,
  };
  return &m;
}
