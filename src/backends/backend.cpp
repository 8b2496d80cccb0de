#include "strata/backend.h"

#include <cstdlib>
#include <cstring>

#include <fmt/ranges.h>

#include "backends/staged_device.h"
#include "base/job.h"
#include "base/parse.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata {
namespace {

void host_copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
}
void host_sync() {}

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

}  // namespace

const Backend& cpu_backend(bool bf16) {
  static const Backend fp32 = [] {
    Backend t{.name = "cpu", .memory = &host_memory(), .upload = host_copy,
              .download = host_copy, .copy = host_copy, .synchronize = host_sync,
              .conv_pool_chunk_bytes = 256 << 10};  // L2-sized (see ConvPool in layers.cpp)
#define STRATA_OP(name, ret, params) t.name = cpu::name;
#include "strata/ops.def"
    return t;
  }();
  // bf16: the ops with GEMMs read bf16 copies of their inputs (kernels_cpu.h lists them).
  static const Backend b16 = [] {
    Backend t = fp32;
#define STRATA_BF16_OP(name) t.name = cpu::bf16::name;
    STRATA_CPU_BF16_OPS(STRATA_BF16_OP)
#undef STRATA_BF16_OP
    return t;
  }();
  return bf16 ? b16 : fp32;
}

bool Backend::supports(Op op) const {
  switch (op) {
#define STRATA_OP(name, ret, params) \
  case Op::name:                     \
    return name != nullptr;
#include "strata/ops.def"
  }
  return false;
}

const char* op_name(Op op) {
  switch (op) {
#define STRATA_OP(name, ret, params) \
  case Op::name:                     \
    return #name;
#include "strata/ops.def"
  }
  return "?";
}

const Backend& select_backend(const DeviceRequest& req, std::string* why, int* gpu) {
  if (gpu) *gpu = -1;
  if (req.device != "auto" && req.device != "cpu" && req.device != "cuda" &&
      req.device != "cpu-staged")
    fail_input("--device {}: expected auto, cpu or cuda", req.device);
  if (req.precision != "fp32" && req.precision != "bf16")
    fail_input("train.precision = \"{}\": expected \"fp32\" or \"bf16\"", req.precision);
  std::string no_gpu;
  const bool cpu_only = req.device == "cpu" || req.device == "cpu-staged";
  const int gpus = cpu_only ? 0 : cuda_devices(&no_gpu);
  if (req.device == "cuda" && gpus == 0)
    fail_input("--device cuda: {}", no_gpu);
  if (gpus > 0) {
    // One GPU per rank: the node-local rank picks it (srun --gpus-per-task=1 leaves each rank
    // one visible GPU, local rank modulo 1 = 0).
    const NodeLocalRank lr = node_local_rank();
    const int dev = lr.rank % gpus;
    const Backend& be = cuda_backend(dev, req.precision == "bf16");
    if (gpu) *gpu = dev;
    if (why)
      *why = fmt::format("cuda (GPU {} of {} visible: {}; node-local rank {} from {}; {}){}; "
                         "CUDA libraries: {}", dev, gpus, cuda_device_name(), lr.rank, lr.source,
                         req.precision, req.device == "auto" ? ", chosen by --device auto" : "",
                         describe_libraries(cuda_libraries()));
    return be;
  }
  const bool bf16 = req.precision == "bf16";
  std::string no_bf16;
  if (bf16 && !cpu::bf16_supported(&no_bf16))
    fail_input("train.precision = \"bf16\" on the CPU: {}; use precision \"fp32\" here",
               no_bf16);
  cpu::blas_init(req.threads);
  if (req.device == "cpu-staged") {
    if (why) *why = "cpu-staged (the CPU ops as a GPU runs them: tagged device memory, deferred "
                    "streams; for tests of the GPU path)";
    return staged_backend(bf16);
  }
  if (why)
    *why = fmt::format("cpu ({} thread{}, {} GEMM kernels{}){}", req.threads,
                       req.threads == 1 ? "" : "s", cpu::blas_corename(),
                       bf16 ? fmt::format("; bf16: linear, conv and attention GEMMs on bf16 "
                                          "inputs with fp32 accumulation, oneDNN {}",
                                          cpu::bf16_matmul_kernels())
                            : "",
                       req.device == "auto" ? fmt::format("; no GPU: {}", no_gpu) : "");
  return cpu_backend(bf16);
}

Tensor to_backend(const Backend& be, const Tensor& t) {
  if (be.host_memory()) return t;
  Tensor d(t.shape, *be.memory);
  be.upload(d.data(), t.data(), sizeof(float) * size_t(t.size()));
  return d;
}

}  // namespace strata
