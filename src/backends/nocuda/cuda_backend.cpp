// A build without the CUDA backend (STRATA_CUDA=OFF, or AUTO without nvcc, cuBLAS, cuDNN or
// NCCL): the answers that say so. The CUDA build links src/backends/cuda_loader instead, which loads
// src/backends/cuda as a module.
#include <memory>

#include "backends/cuda_api.h"
#include "strata/comm.h"
#include "strata/device_comm.h"
#include "strata/error.h"

namespace strata {

int cuda_devices(std::string* why) {
  if (why) *why = "this build of strata has no CUDA backend (built with STRATA_CUDA=OFF, or "
                  "without the CUDA toolkit, cuDNN or NCCL)";
  return 0;
}

const Backend& cuda_backend(int, Precision) {
  throw UserError(kExitBadInput, "this build of strata has no CUDA backend");
}

std::string cuda_device_name() { return ""; }

std::vector<CudaLibrary> cuda_libraries() { return {}; }

std::unique_ptr<DeviceTransport> cuda_transport(Comm&) {
  throw std::logic_error("cuda_transport: this build has no CUDA backend");
}

}  // namespace strata
