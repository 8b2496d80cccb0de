// The communicator over device memory (device_comm.h): float data lives in the backend's
// memory; the device's transport carries the sums, MPI the rest.
// - Allreduces and ZeRO's reduce-scatter / all-gather (the stage replicas' gradient buckets)
//   run on the transport's own stream: a bucket's collective waits for the compute stream's
//   work issued so far (the backward that finished its gradients) and overlaps with the
//   backward still running; completing a handle makes the compute stream wait for it in turn
//   (the optimizer step reads the sums). Where two ranks of the communicator share a device
//   (more ranks than GPUs on a node) the transport has no collectives, and the sums are staged
//   through host memory over the host comm instead, blocking.
// - Pipeline sends and receives are staged through host memory over the host (MPI)
//   communicator: exact, with the MPI path's tags and ordering, at the cost of a copy each way.
//   (NCCL point-to-point has no tags and serialises per communicator, so it needs a
//   communicator and stream per neighbour and direction to be free of deadlock: the next step.)
// - Everything else (host scalars, broadcasts, barriers, the side channel) is the host comm's.
#include "strata/device_comm.h"

#include <chrono>
#include <thread>

#include "backends/provider.h"
#include "base/activity.h"
#include "base/parse.h"
#include "strata/backend.h"
#include "strata/comm.h"
#include "strata/error.h"

namespace strata {
namespace {

class DeviceComm final : public Comm {
 public:
  DeviceComm(std::unique_ptr<Comm> host, const Backend& be, std::unique_ptr<DeviceTransport> t)
      : host_(std::move(host)), be_(be), transport_(std::move(t)) {
    parent_ = host_.get();  // the watchdog's marks are the host comm's (and its parent's)
  }
  ~DeviceComm() override {
    // A collective still in flight (an exception unwinding past it): the transport gives its
    // resources back without waiting, for ever if a peer is gone.
    for (auto& h : handles_)
      if (h.kind == Kind::kDevice) broken_ = true;
    if (broken_) transport_->abandon();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  bool sums_alone() const override { return size() == 1 && transport_->collectives(); }
  std::string sums_library() const override {
    return transport_->collectives() ? transport_->library() : host_->sums_library();
  }

  void allreduce_sum(float* x, int64_t n) override { wait(start_allreduce_sum(x, n)); }
  void allreduce_sum(double* x, int64_t n) override { host_->allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { host_->allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { host_->allreduce_min(x, n); }
  void allreduce_max(double* x, int64_t n) override { host_->allreduce_max(x, n); }
  void broadcast(void* buf, int64_t bytes, int root) override { host_->broadcast(buf, bytes, root); }
  void barrier() override { host_->barrier(); }

  int start_allreduce_sum(float* x, int64_t n) override {
    if (!transport_->collectives() || n == 0)
      return staged(x, n, [&](float* h) { host_->allreduce_sum(h, n); });
    const int h = start_device();
    transport_->allreduce_sum(x, n);
    return end_device(h);
  }
  int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(x, counts, /*reduce=*/true);
  }
  int start_allgather(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(x, counts, /*reduce=*/false);
  }

  int start_send(const float* x, int64_t n, int to, int tag) override {
    const int h = take(Kind::kHost);
    Handle& hd = handles_[size_t(h)];
    hd.staging.resize(size_t(n));
    be_.download(hd.staging.data(), x, sizeof(float) * size_t(n));  // waits for the producer
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
    if (hd.kind == Kind::kHost && !host_->test(hd.host_handle)) return false;
    if (hd.kind == Kind::kDevice && !transport_->query(hd.done)) return false;
    complete(h);
    return true;
  }
  void wait(int h) override {
    Handle& hd = handles_.at(size_t(h));
    if (hd.kind == Kind::kHost) host_->wait(hd.host_handle);  // marks the watchdog itself
    if (hd.kind == Kind::kDevice) wait_device(hd.done);
    complete(h);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    return make_device_comm(host_->split(color, key), be_);
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
  enum class Kind { kFree, kDone, kDevice, kHost };
  struct Handle {
    Kind kind = Kind::kFree;
    DeviceTransport::Event ready = -1, done = -1;  // compute reached the start; finished
    int host_handle = -1;
    std::vector<float> staging;  // host copy of a pipeline message
    float* recv_into = nullptr;  // a receive's device destination
  };

  int start_sharded(float* x, const std::vector<int64_t>& counts, bool reduce) {
    STRATA_CHECK(int(counts.size()) == size(), "{} shard counts for {} ranks", counts.size(), size());
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    if (!transport_->collectives() || n == 0)
      return staged(x, n, [&](float* h) {
        host_->wait(reduce ? host_->start_reduce_scatter_sum(h, counts)
                           : host_->start_allgather(h, counts));
      });
    const int h = start_device();
    transport_->sharded(x, counts, reduce);
    return end_device(h);
  }

  // The sum through host memory (ranks share a device): done on return.
  template <typename F>
  int staged(float* x, int64_t n, F&& sum_on_host) {
    const int h = take(Kind::kDone);
    if (size() > 1 && n > 0) {
      staged_.resize(size_t(n));
      be_.download(staged_.data(), x, sizeof(float) * size_t(n));
      sum_on_host(staged_.data());
      be_.upload(x, staged_.data(), sizeof(float) * size_t(n));
    }
    return h;
  }
  // A device collective: its stream first waits for the compute stream's work so far (the
  // gradients it reads), ...
  int start_device() {
    const int h = take(Kind::kDevice);
    Handle& hd = handles_[size_t(h)];
    if (hd.ready < 0) hd.ready = transport_->new_event();
    if (hd.done < 0) hd.done = transport_->new_event();
    transport_->record_on_compute(hd.ready);
    transport_->comm_waits(hd.ready);
    return h;
  }
  // ... and marks its end, which completing the handle makes the compute stream wait for.
  int end_device(int h) {
    transport_->record_on_comm(handles_[size_t(h)].done);
    return h;
  }

  // Polls rather than blocking in the device, marked as waiting for other ranks: a rank stuck
  // here (a peer that never joins) is one the watchdog names.
  void wait_device(DeviceTransport::Event done) {
    Blocked mark(activity(), Activity::kAllreduce);
    for (int64_t spins = 0; !transport_->query(done); ++spins) {
      // A failed peer or network leaves the collective waiting for ever: NCCL reports it only
      // when asked (as PyTorch's watchdog polls it).
      if (spins % 1000 == 999) {
        try {
          transport_->check_async_error();
        } catch (...) {
          broken_ = true;
          throw;
        }
      }
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

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
  // The data is there: later compute-stream work must see it.
  void complete(int h) {
    Handle& hd = handles_[size_t(h)];
    if (hd.kind == Kind::kDevice) transport_->compute_waits(hd.done);
    if (hd.kind == Kind::kHost && hd.recv_into)
      be_.upload(hd.recv_into, hd.staging.data(), sizeof(float) * hd.staging.size());
    hd.kind = Kind::kFree;
    hd.host_handle = -1;
    hd.recv_into = nullptr;
  }

  std::unique_ptr<Comm> host_;
  const Backend& be_;
  std::unique_ptr<DeviceTransport> transport_;
  bool broken_ = false;          // a collective failed or was left in flight
  std::vector<float> staged_;    // host copy of a sum where ranks share a device
  std::vector<Handle> handles_;  // indexed by handle; events are kept for reuse
};

}  // namespace

bool device_collectives_on_one_rank() {
  return env_int("STRATA_DEVICE_COMM_ONE_RANK", 0, 1).value_or(0) == 1;
}

std::unique_ptr<Comm> make_device_comm(std::unique_ptr<Comm> host, const Backend& be) {
  if (be.host_memory()) return host;
  auto t = provider_of(be).transport(*host);
  return std::make_unique<DeviceComm>(std::move(host), be, std::move(t));
}

}  // namespace strata
