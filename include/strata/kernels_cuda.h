// The CUDA kernels: the ops of strata/ops.def (declared here from that list, with the
// contracts written there), on DEVICE pointers (kernels/cuda/<family>.cu). GEMMs go through cuBLAS(Lt), convolutions through cuDNN,
// the rest are strata's own kernels. Every op is enqueued on the one compute stream of this
// process (stream()); the ops that return a host value (losses, counts, norms) wait for it.
// This header needs no CUDA header, so host code compiled by the C++ compiler can include it;
// it exists only in builds with STRATA_CUDA (CMake defines STRATA_HAVE_CUDA for them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/ops.h"

namespace strata::cuda {

using strata::Conv2dShape;

// ---- Context (kernels/cuda/context.cu) -------------------------------------------------
// GPUs this process sees; 0 when the driver or runtime reports any error (a node with the
// toolkit but no GPU says "driver version is insufficient": that is "no GPU"). why, if not
// null, receives the runtime's message then.
int device_count(std::string* why = nullptr);
// Makes `device` current and creates the compute stream, the cuBLAS and cuDNN handles (once;
// again with the same device does nothing). Throws std::runtime_error on a CUDA error.
void init(int device);
bool initialized();
// GEMMs and convolutions issued while one is alive compute in bf16 (fp32 storage, master
// weights and accumulation); otherwise strict fp32 (no TF32). The CUDA backend's bf16 table
// wraps its precision ops in one (src/backends/cuda/cuda_backend.cpp); ops are issued from
// one thread at a time, so the setting is the context's.
class Bf16Scope {
 public:
  explicit Bf16Scope(bool bf16);
  ~Bf16Scope();
  Bf16Scope(const Bf16Scope&) = delete;
  Bf16Scope& operator=(const Bf16Scope&) = delete;

 private:
  bool previous_;
};
int current_device();
std::string device_name();          // e.g. "NVIDIA H100 80GB HBM3"
void* stream();                     // the compute stream (a cudaStream_t)
void synchronize();                 // waits for the compute stream

// ---- Memory ----------------------------------------------------------------------------
void* alloc(size_t bytes);          // stream-ordered (cudaMallocAsync, pooled); throws
                                    // std::runtime_error when out of memory
void release(void* p);              // stream-ordered (cudaFreeAsync): waits for nothing
void upload(void* dst, const void* src, size_t bytes);     // host -> device, stream-ordered;
                                                           // src may be reused on return
void download(void* dst, const void* src, size_t bytes);   // device -> host, waits for it
void copy(void* dst, const void* src, size_t bytes);       // device -> device, stream-ordered
// Device -> pinned host copies on a stream of their own (Backend's snapshot_*: memory
// checkpoints), after the compute stream's work so far and beside what follows it.
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);
void snapshot_copy(void* dst, const void* src, size_t bytes, int slot);
bool snapshot_ready(int slot);        // from any thread; never waits
void snapshot_device_wait(int slot);  // the compute stream waits; the host does not
void zero(void* p, size_t bytes);                           // stream-ordered memset

// cuDNN's algorithms chosen for a convolution at the current precision, for benchmarks.
std::string conv2d_algorithms(const Conv2dShape& s);

// ---- The ops ---------------------------------------------------------------------------
// As on the CPU, with these differences:
// - labels and token ids are device int32. The embedding cannot throw: its caller checks the
//   ids on the host; an id outside [0,V) gives NaN rows in forward and is skipped in backward.
// - GEMMs (linear, the attention products) and convolutions follow Bf16Scope's precision
//   (strict fp32, or bf16 tensor cores with fp32 accumulation); softmax and every sum are fp32.
// - dropout draws the CPU's mask bit for bit (the same counter-based hash, strata/rng.h).
// - Backward sums are deterministic (no float atomics): embedding_backward adds the CPU's
//   terms in the CPU's order, bit for bit; layernorm_backward chunks rows as the CPU does.
// - attention keeps a device workspace between calls (forward 4*B*T*C floats, backward
//   7*B*T*C + B*NH*T*T); conv2d_scratch_size counts floats of cuDNN workspace.
#define STRATA_OP(name, ret, params) ret name params;
#define STRATA_CPU_OP(name, ret, params)
#include "strata/ops.def"

}  // namespace strata::cuda
