// Backend seam: the table of ops layers call, chosen at run time (--device auto|cpu|cuda).
// Its fields are generated from the one op list (strata/ops.def). A backend value says what it
// is: its name, its precision and the processor that runs its ops; its ops read and write ITS
// memory: tensors they touch are allocated in `memory` (Tensor::resize(shape, *be.memory)),
// and host data crosses with upload/download.
//
// Backends come from providers (src/backends/provider.h: a name, whether this node can run it
// or why not, and the table for a device and precision). select_backend below is the one way
// in; the CPU's table is also reachable directly for tests and tools. Which providers a build
// has is decided in CMake (STRATA_CUDA), not by #ifdefs through the code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/ops.h"
#include "strata/tensor.h"

namespace strata {

// A backend's arithmetic: fp32, or bf16 products (the ops of ops.h's STRATA_PRECISION_OPS
// read bf16 copies of their inputs and accumulate in fp32; everything else stays fp32).
enum class Precision { fp32, bf16 };
const char* precision_name(Precision p);  // "fp32", "bf16"
// What runs a backend's ops: layers size their work for it (a CPU chunk fits in cache, a GPU
// wants the whole batch in one call).
enum class Processor { cpu, gpu };

struct Backend {
  const char* name;
  Precision precision;
  Processor processor;
  const Memory* memory;  // where its tensors live
  bool host_memory() const { return memory->host; }
  // Host <-> backend memory. upload and copy are ordered with the backend's ops; download
  // waits for them. Plain memcpy on the CPU.
  void (*upload)(void* dst, const void* src, size_t bytes);
  void (*download)(void* dst, const void* src, size_t bytes);
  void (*copy)(void* dst, const void* src, size_t bytes);
  void (*synchronize)();  // waits for every op issued so far
  // Optional (a GPU; null on the CPU): copies of backend memory into pinned host memory on a
  // stream of their own, after the ops issued so far and beside the ones issued after, in
  // two slots (double-buffered snapshots: memory checkpoints). snapshot_ready(slot): whether
  // the slot's copies are done (from any thread, without waiting; throws on a device error);
  // snapshot_device_wait(slot): the ops issued after it wait for them, the host does not.
  void* (*alloc_pinned)(size_t bytes) = nullptr;
  void (*free_pinned)(void* p) = nullptr;
  void (*snapshot_copy)(void* dst, const void* src, size_t bytes, int slot) = nullptr;
  bool (*snapshot_ready)(int slot) = nullptr;
  void (*snapshot_device_wait)(int slot) = nullptr;
  // The ops of strata/ops.def, one field each. A backend may leave some null: supports()
  // says which it has, and a model refuses to run where a layer's op is missing.
#define STRATA_OP(name, ret, params) ret(*name) params = nullptr;
#include "strata/ops.def"

  bool supports(Op op) const;
};

// The CPU's ops in either precision (bf16: kernels_cpu.h's cpu::bf16 ops; the caller checks
// that this CPU has native bf16 GEMMs, as select_backend does).
const Backend& cpu_backend(Precision precision = Precision::fp32);

struct DeviceRequest {
  std::string device = "auto";    // auto, or a provider's name: cpu | cuda | cpu-staged (tests)
  int threads = 1;                // CPU math threads
  std::string precision = "fp32"; // fp32 | bf16 (train.precision)
};
// Resolves a request to a backend: a provider by name, or for auto the first provider that
// this node can run (the GPU of this node-local rank when one is visible, else the CPU).
// Throws UserError (exit 2) for what this build or node cannot provide, with the provider's
// reason: cuda without a GPU or without the CUDA backend, bf16 on a CPU without native bf16
// GEMMs (AVX512_BF16 or AMX). `why` says what was chosen and why, for the log; `gpu`, the GPU
// taken (-1: none).
const Backend& select_backend(const DeviceRequest& req, std::string* why, int* gpu = nullptr);

// A copy of host tensor t in the backend's memory (t itself, sharing storage, on the CPU).
Tensor to_backend(const Backend& be, const Tensor& t);

}  // namespace strata
