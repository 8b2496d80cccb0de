#include "strata/comm.h"

#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <vector>

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

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm_(c) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* x, int64_t n) override { reduce(x, n, MPI_FLOAT, MPI_SUM); }
  void allreduce_sum(double* x, int64_t n) override { reduce(x, n, MPI_DOUBLE, MPI_SUM); }
  void allreduce_sum(int64_t* x, int64_t n) override { reduce(x, n, MPI_INT64_T, MPI_SUM); }
  void allreduce_min(int64_t* x, int64_t n) override { reduce(x, n, MPI_INT64_T, MPI_MIN); }
  void allreduce_max(double* x, int64_t n) override { reduce(x, n, MPI_DOUBLE, MPI_MAX); }
  void broadcast(void* buf, int64_t bytes, int root) override {
    chunked(bytes, [&](int64_t off, int cnt) {
      MPI_CHECK(MPI_Bcast(static_cast<char*>(buf) + off, cnt, MPI_BYTE, root, comm_));
    });
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }

  int start_allreduce_sum(float* x, int64_t n) override {
    STRATA_CHECK(n < INT_MAX, "bucket of {} floats is too large for one MPI call", n);
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x, int(n), MPI_FLOAT, MPI_SUM, comm_, &req));
    for (size_t i = 0; i < reqs_.size(); ++i)
      if (reqs_[i] == MPI_REQUEST_NULL) { reqs_[i] = req; return int(i); }
    reqs_.push_back(req);
    return int(reqs_.size() - 1);
  }
  bool test(int h) override {
    int done = 0;
    MPI_CHECK(MPI_Test(&reqs_.at(h), &done, MPI_STATUS_IGNORE));
    return done;  // a completed request is reset to MPI_REQUEST_NULL, so test again is true
  }
  void wait(int h) override { MPI_CHECK(MPI_Wait(&reqs_.at(h), MPI_STATUS_IGNORE)); }
  std::string host() const override { return hostname(); }

 private:
  template <typename T>
  void reduce(T* x, int64_t n, MPI_Datatype t, MPI_Op op) {
    chunked(n, [&](int64_t off, int cnt) {
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x + off, cnt, t, op, comm_));
    });
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> reqs_;
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
  bool test(int) override { return true; }
  void wait(int) override {}
  std::string host() const override { return hostname(); }
};

bool g_mpi_inited = false;

}  // namespace

std::unique_ptr<Comm> make_world_comm() {
  if (!g_mpi_inited) return make_single_comm();
  return std::make_unique<MpiComm>(MPI_COMM_WORLD);
}
std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

void mpi_init(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  g_mpi_inited = true;
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
