// The CUDA backend as a shared module: lib/strata/libstrata_cuda.so (kernels/cuda + src/backends/cuda),
// which strata dlopens at run time (src/backends/cuda_loader) after finding and loading the CUDA
// libraries it was linked against, so that the executable starts on nodes without them. The
// module exports one C function that returns this table of the seam's functions (backend.h,
// device_comm.h); the loader checks that the module comes from the same build before using it.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace strata {

struct Backend;
enum class Precision;
class Comm;
class DeviceTransport;

struct CudaModule {
  const char* build;    // STRATA_VERSION and git_commit() of the module's build
  size_t backend_size;  // sizeof(Backend) there: a stale module from another layout is refused
  int (*devices)(std::string* why);
  const Backend& (*backend)(int device, Precision precision);
  std::string (*device_name)();
  std::unique_ptr<DeviceTransport> (*transport)(Comm& host);
};

inline constexpr const char* kCudaModuleEntry = "strata_cuda_module";

}  // namespace strata

// The module's one exported symbol (its name is kCudaModuleEntry).
extern "C" const strata::CudaModule* strata_cuda_module();
