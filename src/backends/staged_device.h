// --device cpu-staged: the CPU's ops run as a GPU runs them, so that CI finds the GPU path's
// defects without a GPU (src/backends/staged_device.cpp).
// - Its memory is not host memory: device pointers carry a tag in their top 16 bits, which
//   makes them non-canonical x86-64 addresses. Any host read or write through one (a memcpy,
//   an MPI call on device memory, a Tensor's operator[]) crashes at once, and the crash
//   handler prints the stack naming the caller. Only the staged op table, upload, download
//   and copy strip the tag; an op given host memory is an internal error naming the op.
// - Its ops are deferred, as a GPU's are queued on a stream: they run when something waits
//   for them (a download, an op that returns a host value, synchronize, an event), so a
//   missing wait reads results that are not there yet.
// - Its device communicator's transport (device_comm.h) has a stream of its own that waits
//   for compute events as NCCL's does, and runs its collectives as MPI calls on the staged
//   memory; STRATA_STAGED_SHARED_DEVICE=1 makes it answer as a device shared by two ranks
//   (sums staged through the host, as on a GPU node with more ranks than GPUs).
// - Freeing device memory while one of its collectives is in flight is an internal error
//   (on a GPU cudaFree waits for the whole device: a cross-rank hang).
#pragma once
#include <memory>

#include "strata/backend.h"

namespace strata {

class Comm;
class DeviceTransport;

// The staged table: the CPU's fp32 or bf16 ops (not the CPU-only int8 ops), deferred.
const Backend& staged_backend(Precision precision);
// The transport of a device communicator on staged memory. Collective over host.
std::unique_ptr<DeviceTransport> staged_transport(Comm& host);

}  // namespace strata
