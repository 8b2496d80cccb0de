// The CPU backend: kernels/cpu's ops on host memory, in fp32 or bf16, and its provider.
#include "backends/cpu_provider.h"

#include <cstring>

#include <fmt/format.h>

#include "backends/provider.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata {
namespace {

void host_copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
}
void host_sync() {}

const Backend& make_cpu(const DeviceRequest& req, Precision precision, BackendChoice* out) {
  start_cpu_math(req.threads, precision);
  out->why = fmt::format(
      "cpu ({} thread{}, {} GEMM kernels{})", req.threads, req.threads == 1 ? "" : "s",
      cpu::blas_corename(),
      precision == Precision::bf16
          ? fmt::format("; bf16: linear, conv and attention GEMMs on bf16 inputs with fp32 "
                        "accumulation, oneDNN {}", cpu::bf16_matmul_kernels())
          : "");
  return cpu_backend(precision);
}

}  // namespace

const Backend& cpu_backend(Precision precision) {
  static const Backend fp32 = [] {
    Backend t{.name = "cpu", .precision = Precision::fp32, .processor = Processor::cpu,
              .memory = &host_memory(), .upload = host_copy, .download = host_copy,
              .copy = host_copy, .synchronize = host_sync};
#define STRATA_OP(name, ret, params) t.name = cpu::name;
#include "strata/ops.def"
    return t;
  }();
  // bf16: the precision ops read bf16 copies of their inputs (kernels_cpu.h's cpu::bf16).
  static const Backend b16 = [] {
    Backend t = fp32;
    t.precision = Precision::bf16;
#define STRATA_BF16_OP(name) t.name = cpu::bf16::name;
    STRATA_PRECISION_OPS(STRATA_BF16_OP)
    STRATA_CPU_PRECISION_OPS(STRATA_BF16_OP)
#undef STRATA_BF16_OP
    return t;
  }();
  return precision == Precision::bf16 ? b16 : fp32;
}

void start_cpu_math(int threads, Precision precision) {
  std::string no_bf16;
  if (precision == Precision::bf16 && !cpu::bf16_supported(&no_bf16))
    fail_input("train.precision = \"bf16\" on the CPU: {}; use precision \"fp32\" here",
               no_bf16);
  cpu::blas_init(threads);
}

extern const BackendProvider kCpuProvider{.name = "cpu", .what = "CPU", .in_auto = true,
                                          .available = always_available, .make = make_cpu,
                                          .transport = nullptr};

}  // namespace strata
