#include "strata/comm.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "base/activity.h"
#include "base/job.h"
#include "comm/pairwise.h"
#include "strata/error.h"

namespace strata {

// Every MPI call goes through this: failure becomes an error naming the call and the line.
#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                          \
      char msg_[MPI_MAX_ERROR_STRING];                                                 \
      int len_ = 0;                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                              \
      throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, \
                                           #call, std::string(msg_, len_)));           \
    }                                                                                  \
  } while (0)

namespace {

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// MPI counts are int; split larger buffers.
template <typename F>
void chunked(int64_t n, F&& f) {
  for (int64_t off = 0; off < n; off += INT_MAX / 2) f(off, int(std::min<int64_t>(n - off, INT_MAX / 2)));
}

bool g_mpi_inited = false;
int g_thread_level = -1;

// The watchdog's heartbeat channel: a duplicate communicator, one receive posted at a time.
class MpiSideChannel final : public SideChannel {
 public:
  MpiSideChannel(MPI_Comm parent, int bytes, bool receive) : bytes_(bytes), rbuf_(size_t(bytes)) {
    MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    if (receive) post_receive();
  }
  ~MpiSideChannel() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
  }
  void post(int to, const void* msg) override {
    reap();
    int pending = 0;
    for (auto& s : sends_) pending += s.to == to;
    if (pending >= kMaxPending) return;
    sends_.push_back({to, MPI_REQUEST_NULL, std::vector<char>(static_cast<const char*>(msg),
                                                              static_cast<const char*>(msg) + bytes_)});
    auto& s = sends_.back();
    MPI_CHECK(MPI_Isend(s.buf.data(), bytes_, MPI_BYTE, to, kTag, comm_, &s.req));
  }
  bool poll(int* from, void* msg) override {
    reap();  // also drives the sends' progress
    if (rreq_ == MPI_REQUEST_NULL) return false;
    int done = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Test(&rreq_, &done, &st));
    if (!done) return false;
    *from = st.MPI_SOURCE;
    std::memcpy(msg, rbuf_.data(), size_t(bytes_));
    post_receive();
    return true;
  }
  void close(double max_wait_s) override {
    if (rreq_ != MPI_REQUEST_NULL) {
      MPI_CHECK(MPI_Cancel(&rreq_));
      MPI_CHECK(MPI_Wait(&rreq_, MPI_STATUS_IGNORE));
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_wait_s);
    while (reap(), !sends_.empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (auto& s : sends_) MPI_Request_free(&s.req);  // the buffers must outlive them: leak
    for (auto& s : sends_) leaked_.push_back(std::move(s.buf));
    sends_.clear();
  }

 private:
  static constexpr int kTag = 7117;
  static constexpr int kMaxPending = 4;
  struct Send {
    int to;
    MPI_Request req;
    std::vector<char> buf;
  };
  void post_receive() {
    MPI_CHECK(MPI_Irecv(rbuf_.data(), bytes_, MPI_BYTE, MPI_ANY_SOURCE, kTag, comm_, &rreq_));
  }
  void reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      MPI_CHECK(MPI_Test(&it->req, &done, MPI_STATUS_IGNORE));
      it = done ? sends_.erase(it) : std::next(it);
    }
  }
  int bytes_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request rreq_ = MPI_REQUEST_NULL;
  std::vector<char> rbuf_;
  std::list<Send> sends_;
  static inline std::vector<std::vector<char>> leaked_;  // buffers of freed, unfinished sends
};

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c, bool owned = false) : comm_(c), owned_(owned) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~MpiComm() override {
    int fin = 0;
    MPI_Finalized(&fin);
    for (size_t h = 0; h < reqs_.size(); ++h)
      if (armed(int(h))) {  // unwinding with sums in flight: their receives may still land
        leaked_staging_.push_back(std::move(staging_));
        break;
      }
    if (pair_comm_ != MPI_COMM_NULL && !fin) MPI_Comm_free(&pair_comm_);
    if (owned_ && !fin) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* x, int64_t n) override { reduce(x, n, MPI_FLOAT, MPI_SUM); }
  void allreduce_sum(double* x, int64_t n) override { reduce(x, n, MPI_DOUBLE, MPI_SUM); }
  void allreduce_sum(int64_t* x, int64_t n) override { reduce(x, n, MPI_INT64_T, MPI_SUM); }
  void allreduce_min(int64_t* x, int64_t n) override { reduce(x, n, MPI_INT64_T, MPI_MIN); }
  void allreduce_max(double* x, int64_t n) override { reduce(x, n, MPI_DOUBLE, MPI_MAX); }
  void broadcast(void* buf, int64_t bytes, int root) override {
    Blocked b(activity(), Activity::kBroadcast);
    chunked(bytes, [&](int64_t off, int cnt) {
      MPI_CHECK(MPI_Bcast(static_cast<char*>(buf) + off, cnt, MPI_BYTE, root, comm_));
    });
  }
  void barrier() override {
    Blocked b(activity(), Activity::kBarrier);
    MPI_CHECK(MPI_Barrier(comm_));
  }

  // A reduce-scatter of even shards, then an all-gather of the sums, both pairwise
  // (comm/pairwise.h): each element the sum in rank order, the same on every rank.
  int start_allreduce_sum(float* x, int64_t n) override {
    STRATA_CHECK(n < INT_MAX, "bucket of {} floats is too large for one MPI call", n);
    const int64_t seq = seq_++;
    auto s = std::make_shared<Shards>(shards(cache_line_shards(n, size_)));
    return start_pairwise_sums(x, s, seq, [this, x, s, seq](int h) {
      arm(h, pairwise_->post_allgather(x, s->counts, s->displs, seq), {});
    });
  }
  int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& counts) override {
    return start_pairwise_sums(x, std::make_shared<Shards>(shards(counts)), seq_++, {});
  }
  int start_allgather(float* x, const std::vector<int64_t>& counts) override {
    auto s = std::make_shared<Shards>(shards(counts));
    MPI_Request req;
    MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, s->counts.data(),
                              s->displs.data(), MPI_FLOAT, comm_, &req));
    return keep(req, false, [s] {});  // the count arrays live until the call completes
  }
  int start_send(const float* x, int64_t n, int to, int tag) override {
    STRATA_CHECK(n < INT_MAX, "message of {} floats is too large for one MPI call", n);
    MPI_Request req;
    MPI_CHECK(MPI_Isend(x, int(n), MPI_FLOAT, to, tag, comm_, &req));
    return keep(req, true);
  }
  int start_recv(float* x, int64_t n, int from, int tag) override {
    STRATA_CHECK(n < INT_MAX, "message of {} floats is too large for one MPI call", n);
    MPI_Request req;
    MPI_CHECK(MPI_Irecv(x, int(n), MPI_FLOAT, from, tag, comm_, &req));
    return keep(req, true);
  }
  bool test(int h) override { return poll(h); }  // callers test each of their handles
  void wait(int h) override {
    Blocked b(activity(), Activity::kWait);
    if (!yielding_waits_ || !yielding_.at(h)) {
      // Not MPI_Wait: a pairwise sum's all-gather is posted when its reduce-scatter is seen
      // complete, and a peer may be waiting for that of another handle than this one (the
      // caller's order of waits differs between ranks when a finished handle's slot is reused),
      // so a wait moves every handle's phases on.
      while (!poll(h)) advance_others(h);
      return;
    }
    // Spin briefly (a message that is about to arrive costs no sleep), then test with short
    // sleeps: MPI_Wait busy-polls, which takes a core from a rank that has work.
    for (int spins = 0; !test(h); ++spins)
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(spins > 2000 ? 200 : 20));
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    auto c = std::make_unique<MpiComm>(sub, /*owned=*/true);
    c->parent_ = this;
    return c;
  }
  std::string host() const override { return hostname(); }
  const void* mpi_handle() const override { return &comm_; }
  std::vector<std::string> all_gather_text(const std::string& text) override {
    constexpr int kLen = 256;
    std::vector<char> mine(kLen, 0), all(size_t(kLen) * size_t(size_));
    std::memcpy(mine.data(), text.data(), std::min<size_t>(text.size(), kLen - 1));
    {
      Blocked b(activity(), Activity::kAllreduce);
      MPI_CHECK(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm_));
    }
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) out.emplace_back(all.data() + size_t(r) * kLen);
    return out;
  }
  std::unique_ptr<SideChannel> open_side_channel(int msg_bytes, bool receive,
                                                 std::string* why_not) override {
    if (size_ == 1) {
      *why_not = "one rank";
      return nullptr;
    }
    if (g_thread_level < MPI_THREAD_MULTIPLE) {
      *why_not = fmt::format("MPI granted thread level {}, not MPI_THREAD_MULTIPLE", mpi_thread_level());
      return nullptr;
    }
    return std::make_unique<MpiSideChannel>(comm_, msg_bytes, receive);
  }

 private:
  template <typename T>
  void reduce(T* x, int64_t n, MPI_Datatype t, MPI_Op op) {
    Blocked b(activity(), Activity::kAllreduce);
    chunked(n, [&](int64_t off, int cnt) {
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x + off, cnt, t, op, comm_));
    });
  }
  // MPI's int counts and displacements of a sharded buffer.
  struct Shards {
    std::vector<int> counts, displs;
  };
  Shards shards(const std::vector<int64_t>& counts) const {
    STRATA_CHECK(int(counts.size()) == size_, "{} shard counts for {} ranks", counts.size(), size_);
    Shards s;
    int64_t at = 0;
    for (int64_t c : counts) {
      STRATA_CHECK(c >= 0 && at + c < INT_MAX, "shards of {} floats are too large for one MPI call", at + c);
      s.counts.push_back(int(c));
      s.displs.push_back(int(at));
      at += c;
    }
    return s;
  }
  // `after` runs once the request completes (copies out of a staging buffer; keeps the
  // arrays MPI reads until then alive).
  int keep(MPI_Request req, bool yielding, std::function<void()> after = {}) {
    const int i = free_slot();
    keep_at(i, req, yielding, std::move(after));
    return i;
  }
  int free_slot() {
    size_t i = 0;
    while (i < reqs_.size() && (reqs_[i] != MPI_REQUEST_NULL || !more_[i].empty() || after_[i])) ++i;
    if (i == reqs_.size()) {
      reqs_.push_back(MPI_REQUEST_NULL);
      yielding_.push_back(false);
      after_.emplace_back();
      more_.emplace_back();
    }
    return int(i);
  }
  void keep_at(int i, MPI_Request req, bool yielding, std::function<void()> after) {
    reqs_[size_t(i)] = req;
    yielding_[size_t(i)] = yielding;
    after_[size_t(i)] = std::move(after);
  }
  // Handle h's (next) phase: its requests, and what runs once they are complete.
  void arm(int h, std::vector<MPI_Request> reqs, std::function<void()> after) {
    if (reqs.empty()) reqs.push_back(MPI_REQUEST_NULL);
    keep_at(h, reqs.back(), false, std::move(after));
    reqs.pop_back();
    more_[size_t(h)] = std::move(reqs);
  }
  bool armed(int h) const { return reqs_[size_t(h)] != MPI_REQUEST_NULL || !more_[size_t(h)].empty(); }
  // Whether handle h is complete; a phase found complete runs what follows it (a sum, the next
  // phase's posting).
  bool poll(int h) {
    for (;;) {
      int done = 0;
      MPI_CHECK(MPI_Test(&reqs_.at(size_t(h)), &done, MPI_STATUS_IGNORE));
      if (auto& more = more_.at(size_t(h)); done && !more.empty()) {
        MPI_CHECK(MPI_Testall(int(more.size()), more.data(), &done, MPI_STATUSES_IGNORE));
        if (done) more.clear();
      }
      if (!done) return false;
      run_after(h);
      if (!armed(h)) return true;  // a completed request is MPI_REQUEST_NULL: polling again is true
    }
  }
  void advance_others(int h) {
    for (size_t i = 0; i < after_.size(); ++i)
      if (int(i) != h && after_[i]) poll(int(i));
  }
  // The pairwise reduce-scatter; once its parts are in, the shard is summed and `then` may arm
  // the handle's next phase.
  // Staging comes from a pool by size: a buffer goes back once its shard is summed, and the
  // next sum of that size takes it, so a step's buckets reuse the last step's wherever the
  // gradients lie (memory checkpoints move them between steps): (D - 1) / D of the gradients
  // in all.
  int start_pairwise_sums(float* x, std::shared_ptr<Shards> s, int64_t seq, std::function<void(int)> then) {
    if (!pairwise_) {  // the first sum: collective on this communicator, as every sum is
      MPI_CHECK(MPI_Comm_dup(comm_, &pair_comm_));
      pairwise_ = std::make_unique<PairwiseSums>(pair_comm_, rank_, size_);
    }
    const int h = free_slot();
    // Tags repeat every 0x4000 calls (pairwise.cpp): more handles than that could be in flight.
    STRATA_CHECK(reqs_.size() < 0x4000, "{} communication handles in flight", reqs_.size());
    Staging& staged = take_staging(size_t(s->counts[size_t(rank_)]) * size_t(size_ - 1));
    arm(h, pairwise_->post_reduce_scatter(x, s->counts, s->displs, seq, staged.parts),
        [this, h, x, s, &staged, then = std::move(then)] {
          pairwise_->sum_shard(x, s->counts, s->displs, staged.parts);
          staged.busy = false;
          if (then) then(h);
        });
    return h;
  }
  struct Staging {
    std::vector<float> parts;  // reduce-scatter parts received
    bool busy = false;
  };
  Staging& take_staging(size_t floats) {
    auto it = std::find_if(staging_.begin(), staging_.end(),
                           [&](const Staging& s) { return !s.busy && s.parts.size() == floats; });
    if (it == staging_.end()) it = staging_.insert(staging_.end(), Staging{std::vector<float>(floats)});
    it->busy = true;
    return *it;
  }
  void run_after(int h) {
    if (auto f = std::exchange(after_.at(size_t(h)), nullptr)) f();
  }
  MPI_Comm comm_;
  bool owned_ = false;  // a split: freed with this object
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> reqs_;
  std::vector<bool> yielding_;  // point-to-point: wait() sleeps between tests
  std::vector<std::function<void()>> after_;
  std::vector<std::vector<MPI_Request>> more_;  // a handle's other requests (reduce-scatter)
  std::list<Staging> staging_;  // (a list: a taken buffer stays where it is while others are added)
  static inline std::vector<std::list<Staging>> leaked_staging_;
  MPI_Comm pair_comm_ = MPI_COMM_NULL;           // PairwiseSums' own, made at the first sum
  std::unique_ptr<PairwiseSums> pairwise_;
  int64_t seq_ = 0;                              // pairwise calls started: their tags
};

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void allreduce_sum(int64_t*, int64_t) override {}
  void allreduce_min(int64_t*, int64_t) override {}
  void allreduce_max(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  int start_allreduce_sum(float*, int64_t) override { return 0; }
  int start_reduce_scatter_sum(float*, const std::vector<int64_t>&) override { return 0; }
  int start_allgather(float*, const std::vector<int64_t>&) override { return 0; }
  int start_send(const float*, int64_t, int to, int) override {
    throw std::logic_error(fmt::format("send to rank {} on a one-rank communicator", to));
  }
  int start_recv(float*, int64_t, int from, int) override {
    throw std::logic_error(fmt::format("receive from rank {} on a one-rank communicator", from));
  }
  std::unique_ptr<Comm> split(int, int) override { return std::make_unique<SingleComm>(); }
  bool test(int) override { return true; }
  void wait(int) override {}
  std::string host() const override { return hostname(); }
  std::vector<std::string> all_gather_text(const std::string& text) override {
    return {text.substr(0, 255)};
  }
  std::unique_ptr<SideChannel> open_side_channel(int, bool, std::string* why_not) override {
    *why_not = "one rank";
    return nullptr;
  }
};

}  // namespace

std::vector<int64_t> cache_line_shards(int64_t n, int ranks) {
  constexpr int64_t kAlign = 16;
  const int64_t per = (n / ranks + kAlign - 1) / kAlign * kAlign;
  std::vector<int64_t> counts;
  int64_t left = n;
  for (int r = 0; r < ranks; ++r) {
    counts.push_back(r + 1 == ranks ? left : std::min(per, left));
    left -= counts.back();
  }
  return counts;
}

std::unique_ptr<Comm> make_world_comm() {
  if (!g_mpi_inited) return make_single_comm();
  return std::make_unique<MpiComm>(MPI_COMM_WORLD);
}
std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

void mpi_init(int* argc, char*** argv) {
  // A process started without mpirun or srun is an MPI singleton: Open MPI would fork a daemon
  // for it (0.3-0.6 s of every `strata prepare`, `inspect` or error message, and on a node
  // without ssh a failed start). strata never spawns processes, so the singleton stands
  // alone. A launched rank does not read this; a value the user set is kept.
  ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
  // A singleton talks to itself alone: Open MPI's default choice of transport probes UCX and
  // the PCI devices first (0.2 s of every start here); ob1 over `self` is all it needs. Only
  // where no launcher is seen, so a rank of a job keeps the site's transports.
  if (!started_by_mpi_launcher()) {
    ::setenv("OMPI_MCA_pml", "ob1", 0);
    ::setenv("OMPI_MCA_btl", "self", 0);
    // Every isolated singleton is job 0 to Open MPI: side by side (two `strata prepare` on a
    // node) they raced for one session folder, and one failed its start. A folder of its own,
    // removed by MPI_Finalize.
    const char* tmp = std::getenv("TMPDIR");
    const std::string top = std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-mpi." + std::to_string(::getpid());
    ::setenv("OMPI_MCA_orte_top_session_dir", top.c_str(), 0);
  }
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  g_mpi_inited = true;
  g_thread_level = provided;
}

std::string mpi_thread_level() {
  switch (g_thread_level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "none";
  }
}

void mpi_finalize() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_mpi_inited && !fin) MPI_Finalize();
}

void mpi_abort(int code) {
  if (g_mpi_inited) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace strata
