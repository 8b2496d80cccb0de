// The CUDA backend's device transport (device_comm.h): NCCL collectives on a stream of their
// own, ordered against the compute stream with CUDA events. Where two ranks of the
// communicator share a GPU (more ranks than GPUs on a node: device = local rank modulo GPUs)
// NCCL refuses to form a communicator ("Duplicate GPU detected"): then there are no
// collectives and the communicator stages its sums through the host.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda_api.h"
#include "strata/comm.h"
#include "strata/device_comm.h"
#include "strata/kernels_cuda.h"

namespace strata {
namespace {

#define CUDA_OK(call)                                                                        \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess)                                                                   \
      throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #call, \
                                           cudaGetErrorString(e_)));                         \
  } while (0)
#define NCCL_OK(call)                                                                        \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess)                                                                   \
      throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #call, \
                                           ncclGetErrorString(r_)));                         \
  } while (0)

cudaStream_t compute_stream() { return static_cast<cudaStream_t>(cuda::stream()); }

class NcclTransport final : public DeviceTransport {
 public:
  // Collective over host: every rank gets the same answer to collectives().
  explicit NcclTransport(Comm& host) {
    const bool wanted = host.size() > 1 || device_collectives_on_one_rank();
    if (!wanted || gpu_shared(host)) return;
    (void)compute_stream();  // makes this rank's GPU current on this thread, for NCCL
    ncclUniqueId id{};
    if (host.rank() == 0) NCCL_OK(ncclGetUniqueId(&id));
    host.broadcast(&id, sizeof id, 0);
    NCCL_OK(ncclCommInitRank(&nccl_, host.size(), id, host.rank()));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclTransport() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (nccl_ && abandoned_)
      ncclCommAbort(nccl_);  // destroying would wait for the collective in flight
    else if (nccl_)
      ncclCommDestroy(nccl_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  bool collectives() const override { return nccl_ != nullptr; }
  const char* library() const override { return "nccl"; }

  Event new_event() override {
    cudaEvent_t e = nullptr;
    CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
    return Event(events_.size() - 1);
  }
  void record_on_compute(Event e) override { CUDA_OK(cudaEventRecord(ev(e), compute_stream())); }
  void record_on_comm(Event e) override { CUDA_OK(cudaEventRecord(ev(e), stream_)); }
  void comm_waits(Event e) override { CUDA_OK(cudaStreamWaitEvent(stream_, ev(e), 0)); }
  void compute_waits(Event e) override {
    CUDA_OK(cudaStreamWaitEvent(compute_stream(), ev(e), 0));
  }
  bool query(Event e) override {
    const cudaError_t r = cudaEventQuery(ev(e));
    if (r == cudaErrorNotReady) return false;
    CUDA_OK(r);
    return true;
  }
  void check_async_error() override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(nccl_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      abandoned_ = true;
      NCCL_OK(r != ncclSuccess ? r : async);
    }
  }

  void allreduce_sum(float* x, int64_t n) override {
    NCCL_OK(ncclAllReduce(x, x, size_t(n), ncclFloat, ncclSum, nccl_, stream_));
  }
  // NCCL has no reduce-scatter or all-gather of unequal shards: a group of one reduce (or
  // broadcast) per owner. The sum's order is NCCL's, as in the allreduce.
  void sharded(float* x, const std::vector<int64_t>& counts, bool reduce) override {
    NCCL_OK(ncclGroupStart());
    int64_t at = 0;
    for (int r = 0; r < int(counts.size()); ++r) {
      const size_t c = size_t(counts[size_t(r)]);
      if (c > 0 && reduce) NCCL_OK(ncclReduce(x + at, x + at, c, ncclFloat, ncclSum, r, nccl_, stream_));
      if (c > 0 && !reduce) NCCL_OK(ncclBroadcast(x + at, x + at, c, ncclFloat, r, nccl_, stream_));
      at += int64_t(c);
    }
    NCCL_OK(ncclGroupEnd());
  }

  void abandon() override { abandoned_ = true; }

 private:
  cudaEvent_t ev(Event e) const { return events_.at(size_t(e)); }

  // Whether two ranks of host use the same GPU: the same PCI device on the same host (host
  // name and boot id, as NCCL tells hosts apart). Collective over host.
  static bool gpu_shared(Comm& host) {
    if (host.size() == 1) return false;
    char bus[64] = {};
    CUDA_OK(cudaDeviceGetPCIBusId(bus, int(sizeof bus), cuda::current_device()));
    std::string boot;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
    const std::string id = host.host() + "/" + boot + "/" + bus;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : id) hash = (hash ^ c) * 1099511628211ull;
    std::vector<int64_t> ids(size_t(host.size()), 0);
    ids[size_t(host.rank())] = int64_t(hash >> 1) | 1;  // > 0: a sum of one term per slot
    host.allreduce_sum(ids.data(), int64_t(ids.size()));
    std::sort(ids.begin(), ids.end());
    return std::adjacent_find(ids.begin(), ids.end()) != ids.end();
  }

  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool abandoned_ = false;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

std::unique_ptr<DeviceTransport> cuda_transport(Comm& host) {
  return std::make_unique<NcclTransport>(host);
}

}  // namespace strata
