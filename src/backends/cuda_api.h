// The CUDA backend as the rest of strata sees it. In builds with STRATA_CUDA these functions
// forward to the module libstrata_cuda.so that strata loads at run time with the CUDA
// libraries it finds (cuda_loader/); in builds without, nocuda/ answers that there is none.
// The module implements them in cuda/ (and exports them as strata/cuda_module.h's table).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "strata/backend.h"

namespace strata {

class Comm;
class DeviceTransport;

// GPUs this process sees; 0 (with the reason in *why) when none, when the node lacks the
// driver or the CUDA libraries, or when not built.
int cuda_devices(std::string* why);
// Takes GPU `device` (the caller picks it from the node-local rank) and returns its table in
// `precision`.
const Backend& cuda_backend(int device, Precision precision);
std::string cuda_device_name();
// A library the CUDA backend runs on: its soname, the file, and what pointed there (an
// environment variable, a Python environment, the loader's default path ...).
struct CudaLibrary {
  std::string soname, path, source;
};
// The libraries loaded for the CUDA backend, the driver last (empty until cuda_devices has
// loaded them: on a node with the NVIDIA driver and every library).
std::vector<CudaLibrary> cuda_libraries();
// The device transport of a communicator over CUDA memory (device_comm.h): NCCL. Collective
// over host.
std::unique_ptr<DeviceTransport> cuda_transport(Comm& host);

}  // namespace strata
