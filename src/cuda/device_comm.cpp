// The communicator of the CUDA backend: float data lives on the GPU.
// - Allreduces (the stage replicas' gradient buckets) run on NCCL, on a stream of their own:
//   a bucket's allreduce waits for the compute stream's work issued so far (the backward that
//   finished its gradients), and overlaps with the backward still running; completing a handle
//   makes the compute stream wait for it in turn (the optimizer step reads the sums). Where two
//   ranks of the communicator share a GPU (more ranks than GPUs on a node: device = local rank
//   modulo GPUs) NCCL refuses to form a communicator ("Duplicate GPU detected"), so there the
//   allreduces are staged through host memory over the host comm instead, blocking.
// - Pipeline sends and receives are staged through host memory over the host (MPI)
//   communicator: exact, with the MPI path's tags and ordering, at the cost of a copy each way.
//   (NCCL point-to-point has no tags and serialises per communicator, so it needs a
//   communicator and stream per neighbour and direction to be free of deadlock: the next step.)
// - Everything else (host scalars, broadcasts, barriers, the side channel) is the host comm's.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "strata/backend.h"
#include "strata/comm.h"
#include "strata/kernels_cuda.h"
#include "strata/activity.h"
#include "strata/error.h"

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

class CudaComm final : public Comm {
 public:
  explicit CudaComm(std::unique_ptr<Comm> host) : host_(std::move(host)) {
    parent_ = host_.get();  // the watchdog's marks are the host comm's (and its parent's)
    if (host_->size() > 1 && !gpu_shared()) {
      (void)compute_stream();  // makes this rank's GPU current on this thread, for NCCL
      ncclUniqueId id{};
      if (host_->rank() == 0) NCCL_OK(ncclGetUniqueId(&id));
      host_->broadcast(&id, sizeof id, 0);
      NCCL_OK(ncclCommInitRank(&nccl_, host_->size(), id, host_->rank()));
      CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
  }
  ~CudaComm() override {
    // Abort, not destroy, after an NCCL error or with an allreduce still in flight (an
    // exception unwinding past it): destroying waits for it, for ever if a peer is gone.
    bool in_flight = false;
    for (auto& h : handles_) in_flight = in_flight || h.kind == Kind::kNccl;
    for (auto& h : handles_) destroy_events(h);
    if (nccl_ && (broken_ || in_flight))
      ncclCommAbort(nccl_);
    else if (nccl_)
      ncclCommDestroy(nccl_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void allreduce_sum(float* x, int64_t n) override { wait(start_allreduce_sum(x, n)); }
  void allreduce_sum(double* x, int64_t n) override { host_->allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { host_->allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { host_->allreduce_min(x, n); }
  void allreduce_max(double* x, int64_t n) override { host_->allreduce_max(x, n); }
  void broadcast(void* buf, int64_t bytes, int root) override { host_->broadcast(buf, bytes, root); }
  void barrier() override { host_->barrier(); }

  int start_allreduce_sum(float* x, int64_t n) override {
    const int h = take(Kind::kNccl);
    Handle& hd = handles_[size_t(h)];
    if (!nccl_ || n == 0) {
      hd.kind = Kind::kDone;
      if (size() > 1 && n > 0) {  // ranks share a GPU: staged, done on return
        staged_.resize(size_t(n));
        cuda::download(staged_.data(), x, sizeof(float) * size_t(n));
        host_->allreduce_sum(staged_.data(), n);
        cuda::upload(x, staged_.data(), sizeof(float) * size_t(n));
      }
      return h;
    }
    ensure_events(hd);
    CUDA_OK(cudaEventRecord(hd.ready, compute_stream()));
    CUDA_OK(cudaStreamWaitEvent(stream_, hd.ready, 0));
    NCCL_OK(ncclAllReduce(x, x, size_t(n), ncclFloat, ncclSum, nccl_, stream_));
    CUDA_OK(cudaEventRecord(hd.done, stream_));
    return h;
  }

  // NCCL has no reduce-scatter or all-gather of unequal shards: a group of one reduce (or
  // broadcast) per owner. The sum's order is NCCL's, as in the allreduce.
  int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(x, counts, /*reduce=*/true);
  }
  int start_allgather(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(x, counts, /*reduce=*/false);
  }
  int start_sharded(float* x, const std::vector<int64_t>& counts, bool reduce) {
    STRATA_CHECK(int(counts.size()) == size(), "{} shard counts for {} ranks", counts.size(), size());
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    const int h = take(Kind::kNccl);
    Handle& hd = handles_[size_t(h)];
    if (!nccl_ || n == 0) {
      hd.kind = Kind::kDone;
      if (size() > 1 && n > 0) {  // ranks share a GPU: staged through the host, done on return
        staged_.resize(size_t(n));
        cuda::download(staged_.data(), x, sizeof(float) * size_t(n));
        host_->wait(reduce ? host_->start_reduce_scatter_sum(staged_.data(), counts)
                           : host_->start_allgather(staged_.data(), counts));
        cuda::upload(x, staged_.data(), sizeof(float) * size_t(n));
      }
      return h;
    }
    ensure_events(hd);
    CUDA_OK(cudaEventRecord(hd.ready, compute_stream()));
    CUDA_OK(cudaStreamWaitEvent(stream_, hd.ready, 0));
    NCCL_OK(ncclGroupStart());
    int64_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t c = size_t(counts[size_t(r)]);
      if (c > 0 && reduce) NCCL_OK(ncclReduce(x + at, x + at, c, ncclFloat, ncclSum, r, nccl_, stream_));
      if (c > 0 && !reduce) NCCL_OK(ncclBroadcast(x + at, x + at, c, ncclFloat, r, nccl_, stream_));
      at += int64_t(c);
    }
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaEventRecord(hd.done, stream_));
    return h;
  }

  int start_send(const float* x, int64_t n, int to, int tag) override {
    const int h = take(Kind::kHost);
    Handle& hd = handles_[size_t(h)];
    hd.staging.resize(size_t(n));
    cuda::download(hd.staging.data(), x, sizeof(float) * size_t(n));  // waits for the producer
    hd.host_handle = host_->start_send(hd.staging.data(), n, to, tag);
    return h;
  }
  int start_recv(float* x, int64_t n, int from, int tag) override {
    const int h = take(Kind::kHost);
    Handle& hd = handles_[size_t(h)];
    hd.staging.resize(size_t(n));
    hd.recv_into = x;
    hd.host_handle = host_->start_recv(hd.staging.data(), n, from, tag);
    return h;
  }

  bool test(int h) override {
    Handle& hd = handles_.at(size_t(h));
    if (hd.kind == Kind::kHost) {
      if (!host_->test(hd.host_handle)) return false;
    } else if (hd.kind == Kind::kNccl) {
      const cudaError_t e = cudaEventQuery(hd.done);
      if (e == cudaErrorNotReady) return false;
      CUDA_OK(e);
    }
    complete(h);
    return true;
  }
  void wait(int h) override {
    Handle& hd = handles_.at(size_t(h));
    if (hd.kind == Kind::kHost) {
      host_->wait(hd.host_handle);  // marks the watchdog's activity itself
    } else if (hd.kind == Kind::kNccl) {
      // Poll rather than cudaEventSynchronize, marked as waiting for other ranks: a rank
      // stuck here (a peer that never joins the allreduce) is one the watchdog names.
      Activity* a = activity();
      if (a) a->enter(Activity::kAllreduce);
      for (int64_t spins = 0;; ++spins) {
        const cudaError_t e = cudaEventQuery(hd.done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
          if (a) a->leave(Activity::kAllreduce);
          CUDA_OK(e);
        }
        // A failed peer or network leaves the NCCL kernel waiting for ever: NCCL reports it
        // only here (as PyTorch's watchdog polls it).
        if (spins % 1000 == 999) {
          ncclResult_t async = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(nccl_, &async);
          if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            if (a) a->leave(Activity::kAllreduce);
            broken_ = true;
            NCCL_OK(r != ncclSuccess ? r : async);
          }
        }
        if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      if (a) a->leave(Activity::kAllreduce);
    }
    complete(h);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    return std::make_unique<CudaComm>(host_->split(color, key));
  }
  std::string host() const override { return host_->host(); }
  std::vector<std::string> all_gather_text(const std::string& text) override {
    return host_->all_gather_text(text);
  }
  std::unique_ptr<SideChannel> open_side_channel(int msg_bytes, bool receive,
                                                 std::string* why_not) override {
    return host_->open_side_channel(msg_bytes, receive, why_not);
  }

 private:
  enum class Kind { kFree, kDone, kNccl, kHost };
  struct Handle {
    Kind kind = Kind::kFree;
    cudaEvent_t ready = nullptr, done = nullptr;  // NCCL: compute reached the start; finished
    int host_handle = -1;
    std::vector<float> staging;  // host copy of a pipeline message
    float* recv_into = nullptr;  // a receive's device destination
  };

  int take(Kind k) {
    for (size_t i = 0; i < handles_.size(); ++i)
      if (handles_[i].kind == Kind::kFree) {
        handles_[i].kind = k;
        return int(i);
      }
    handles_.emplace_back();
    handles_.back().kind = k;
    return int(handles_.size() - 1);
  }
  // Whether two ranks of this communicator use the same GPU: the same PCI device on the same
  // host (host name and boot id, as NCCL tells hosts apart). Collective over host_; every
  // rank gets the same answer.
  bool gpu_shared() {
    char bus[64] = {};
    CUDA_OK(cudaDeviceGetPCIBusId(bus, int(sizeof bus), cuda::current_device()));
    std::string boot;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
    const std::string id = host_->host() + "/" + boot + "/" + bus;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : id) hash = (hash ^ c) * 1099511628211ull;
    std::vector<int64_t> ids(size_t(host_->size()), 0);
    ids[size_t(host_->rank())] = int64_t(hash >> 1) | 1;  // > 0: a sum of one term per slot
    host_->allreduce_sum(ids.data(), int64_t(ids.size()));
    std::sort(ids.begin(), ids.end());
    return std::adjacent_find(ids.begin(), ids.end()) != ids.end();
  }
  static void ensure_events(Handle& h) {
    if (!h.ready) CUDA_OK(cudaEventCreateWithFlags(&h.ready, cudaEventDisableTiming));
    if (!h.done) CUDA_OK(cudaEventCreateWithFlags(&h.done, cudaEventDisableTiming));
  }
  static void destroy_events(Handle& h) {
    if (h.ready) cudaEventDestroy(h.ready);
    if (h.done) cudaEventDestroy(h.done);
    h.ready = h.done = nullptr;
  }
  // The data is there: later compute-stream work must see it.
  void complete(int h) {
    Handle& hd = handles_[size_t(h)];
    if (hd.kind == Kind::kNccl) CUDA_OK(cudaStreamWaitEvent(compute_stream(), hd.done, 0));
    if (hd.kind == Kind::kHost && hd.recv_into)
      cuda::upload(hd.recv_into, hd.staging.data(), sizeof(float) * hd.staging.size());
    hd.kind = Kind::kFree;
    hd.host_handle = -1;
    hd.recv_into = nullptr;
  }

  std::unique_ptr<Comm> host_;
  ncclComm_t nccl_ = nullptr;
  bool broken_ = false;          // NCCL reported an error: abort the communicator
  cudaStream_t stream_ = nullptr;
  std::vector<float> staged_;    // host copy of an allreduce where ranks share a GPU
  std::vector<Handle> handles_;  // indexed by handle; events are kept for reuse
};

}  // namespace

std::unique_ptr<Comm> make_device_comm(std::unique_ptr<Comm> host, const Backend& be) {
  if (std::string(be.name) != "cuda") return host;  // host memory, or cpu-staged (MPI reads it)
  return std::make_unique<CudaComm>(std::move(host));
}

}  // namespace strata
