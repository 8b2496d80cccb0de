// The CUDA backend's provider: a GPU per rank, picked by the node-local rank.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cuda_api.h"
#include "backends/provider.h"
#include "base/job.h"

namespace strata {
namespace {

// "libcudart.so.13, libcublas.so.13 from DIR (SOURCE); ...": the libraries grouped by
// directory in load order, cuDNN's sub-libraries counted rather than named.
std::string describe_libraries(const std::vector<CudaLibrary>& libs) {
  std::string out;
  for (size_t i = 0; i < libs.size();) {
    const std::string dir = libs[i].path.substr(0, libs[i].path.rfind('/'));
    std::vector<std::string> names;
    int subs = 0;
    size_t j = i;
    for (; j < libs.size() && libs[j].path.substr(0, libs[j].path.rfind('/')) == dir; ++j) {
      if (libs[j].soname.rfind("libcudnn_", 0) == 0)
        ++subs;
      else
        names.push_back(libs[j].soname);
    }
    if (subs) names.push_back(fmt::format("{} cuDNN sub-libraries", subs));
    out += fmt::format("{}{} from {} ({})", out.empty() ? "" : "; ", fmt::join(names, ", "), dir,
                       libs[i].source);
    i = j;
  }
  return out;
}

bool gpu_visible(std::string* why) { return cuda_devices(why) > 0; }

// One GPU per rank: the node-local rank picks it (job.h's node_local_rank: the launcher's
// variable before an inherited SLURM_LOCALID), modulo the GPUs visible (srun
// --gpus-per-task=1 leaves each rank one visible GPU: local rank modulo 1 = 0).
const Backend& make_cuda(const DeviceRequest&, Precision precision, BackendChoice* out) {
  const int gpus = cuda_devices(nullptr);
  const NodeLocalRank lr = node_local_rank();
  const int dev = lr.rank % gpus;
  const Backend& be = cuda_backend(dev, precision);
  out->gpu = dev;
  out->why = fmt::format("cuda (GPU {} of {} visible: {}; node-local rank {} from {}; {}); "
                         "CUDA libraries: {}", dev, gpus, cuda_device_name(), lr.rank, lr.source,
                         precision_name(precision), describe_libraries(cuda_libraries()));
  return be;
}

}  // namespace

extern const BackendProvider kCudaProvider{.name = "cuda", .what = "GPU", .in_auto = true,
                                           .available = gpu_visible, .make = make_cuda,
                                           .transport = cuda_transport};

}  // namespace strata
