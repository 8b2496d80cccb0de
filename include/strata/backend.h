// Backend seam: the table of ops layers call, chosen at run time (--device auto|cpu|cuda).
// Its fields are generated from the one op list (strata/ops.def); the CPU table points at
// kernels/cpu, the CUDA table (src/cuda) at kernels/cuda. Which backends exist is decided in CMake (STRATA_CUDA), not by #ifdefs through the
// code: a build without CUDA links src/nocuda, whose answers say so.
//
// A backend's ops read and write ITS memory: tensors they touch are allocated in `memory`
// (Tensor::resize(shape, *be.memory)), and host data crosses with upload/download.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/ops.h"
#include "strata/tensor.h"

namespace strata {

class Comm;
class DeviceTransport;

struct Backend {
  const char* name;
  const Memory* memory;  // where its tensors live
  bool host_memory() const { return memory->host; }
  // Host <-> backend memory. upload and copy are ordered with the backend's ops; download
  // waits for them. Plain memcpy on the CPU.
  void (*upload)(void* dst, const void* src, size_t bytes);
  void (*download)(void* dst, const void* src, size_t bytes);
  void (*copy)(void* dst, const void* src, size_t bytes);
  void (*synchronize)();  // waits for every op issued so far
  // The conv+pool layer convolves this many bytes of output per chunk before pooling it (the
  // CPU keeps a chunk in cache; a GPU wants the whole batch at once).
  int64_t conv_pool_chunk_bytes;
  // The ops of strata/ops.def, one field each. A backend may leave some null: supports()
  // says which it has, and a model refuses to run where a layer's op is missing.
#define STRATA_OP(name, ret, params) ret(*name) params = nullptr;
#include "strata/ops.def"

  bool supports(Op op) const;
};

// The CPU's ops; bf16: its linear and conv GEMMs on bf16 copies of their inputs (kernels_cpu.h).
const Backend& cpu_backend(bool bf16 = false);

struct DeviceRequest {
  std::string device = "auto";    // auto | cpu | cuda | cpu-staged (tests: see backend.cpp)
  int threads = 1;                // CPU math threads
  std::string precision = "fp32"; // fp32 | bf16 (GEMMs and convolutions)
};
// Resolves a request to a backend: auto takes the GPU of this node-local rank when one is
// visible, else the CPU. Throws UserError (exit 2) for what this build or node cannot provide:
// cuda without a GPU or without the CUDA backend, bf16 on a CPU without native bf16 GEMMs
// (AVX512_BF16 or AMX). `why` says what was
// chosen and why, for the log; `gpu`, the GPU taken (-1: none). The GPU is the node-local rank
// (job.h's node_local_rank: the launcher's variable before an inherited SLURM_LOCALID) modulo
// the GPUs visible.
const Backend& select_backend(const DeviceRequest& req, std::string* why, int* gpu = nullptr);

// A copy of host tensor t in the backend's memory (t itself, sharing storage, on the CPU).
Tensor to_backend(const Backend& be, const Tensor& t);

// ---- The CUDA backend (src/cuda in builds with STRATA_CUDA, else src/nocuda) -------------
// In builds with STRATA_CUDA, src/cuda is a module strata loads at run time with the CUDA
// libraries it finds (src/cuda_loader); these functions forward to it.
// GPUs this process sees; 0 (with the reason in *why) when none, when the node lacks the
// driver or the CUDA libraries, or when not built.
int cuda_devices(std::string* why);
// Takes GPU `device` (the caller picks it from the node-local rank) and returns the table.
const Backend& cuda_backend(int device, bool bf16);
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
