// --device cpu-staged (staged_device.h): tagged device memory, deferred streams, a stand-in
// transport for the device communicator, and a crash handler that names the caller.
#include "backends/staged_device.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu_provider.h"
#include "backends/provider.h"
#include "base/parse.h"
#include "strata/backend.h"
#include "strata/comm.h"
#include "strata/device_comm.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata {
namespace {

// ---- Tagged memory ------------------------------------------------------------------------
// A device pointer is a host pointer with 0x5eed in its top 16 bits: non-canonical on x86-64
// (bits 63..47 must all equal bit 47), so dereferencing it faults, while pointer arithmetic
// on it (offsets into a flat buffer) keeps the tag.
constexpr uintptr_t kTag = uintptr_t(0x5eed) << 48;
constexpr uintptr_t kAddressBits = (uintptr_t(1) << 48) - 1;

bool tagged(const void* p) { return (reinterpret_cast<uintptr_t>(p) & ~kAddressBits) == kTag; }
void* tag(void* p) {
  STRATA_CHECK((reinterpret_cast<uintptr_t>(p) & ~kAddressBits) == 0,
               "cpu-staged: host address {} uses the top 16 bits", p);
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kTag);
}
// The host address of device pointer p (null stays null); `what` names the caller for the
// error when p is host memory.
template <typename T>
T* host_of(T* p, const char* what) {
  if (!p) return p;
  if (!tagged(p))
    throw std::logic_error(fmt::format("cpu-staged: {} was given host memory ({}) where device "
                                       "memory belongs", what, static_cast<const void*>(p)));
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) & kAddressBits);
}
void host_only(const void* p, const char* what) {
  if (p && tagged(p))
    throw std::logic_error(fmt::format("cpu-staged: {} was given device memory where host "
                                       "memory belongs", what));
}

// ---- Streams ------------------------------------------------------------------------------
// One lock for every stream of the process: ops are issued from one thread, but the loader's
// and the watchdog's threads may free memory.
std::recursive_mutex g_mu;

// The compute stream: the ops, uploads, copies and memsets in issue order, run when waited for.
struct ComputeStream {
  std::deque<std::function<void()>> items;
  int64_t issued = 0, done = 0;
  void push(std::function<void()> f) {
    items.push_back(std::move(f));
    ++issued;
  }
  // An item that throws (a CPU kernel's UserError) counts as run: its error surfaces here, at
  // the wait, as a GPU's error surfaces at the next synchronising call.
  void run_until(int64_t seq) {
    while (done < seq) {
      auto f = std::move(items.front());
      items.pop_front();
      ++done;
      f();
    }
  }
  void drain() { run_until(issued); }
};
ComputeStream& compute() {
  static auto* s = new ComputeStream;  // never destroyed: memory may be freed at exit
  return *s;
}

// A collectives' stream: items that poll (a collective in flight on MPI) or finish blocking.
struct CommItem {
  std::function<bool()> poll;    // progress without blocking; true when done
  std::function<void()> finish;  // block until done
};
struct CommStream {
  std::deque<CommItem> items;
  int64_t issued = 0, done = 0;
  void push(CommItem it) {
    items.push_back(std::move(it));
    ++issued;
  }
  bool progress(int64_t seq) {  // never blocks
    while (done < seq && items.front().poll()) pop();
    return done >= seq;
  }
  // (An item polled once and finished later is polled again first: its poll starts it once.)
  void run_until(int64_t seq) {
    while (done < seq) {
      CommItem it = std::move(items.front());
      pop();
      if (!it.poll()) it.finish();
    }
  }
  void pop() {
    items.pop_front();
    ++done;
  }
};
int g_in_flight = 0;  // collectives started and not finished, over all comm streams

// ---- Memory -------------------------------------------------------------------------------
void* staged_alloc(size_t bytes) { return tag(host_memory().alloc(bytes)); }

void staged_release(void* p) {
  if (!p) return;
  std::lock_guard lock(g_mu);
  // cudaFree waits for the whole device; with a collective in flight that is a rank waiting
  // in the free for peers that may wait for it.
  if (g_in_flight > 0 && std::uncaught_exceptions() == 0)
    throw std::logic_error("cpu-staged: device memory freed while a collective is in flight "
                           "(on a GPU cudaFree waits for the collective: a cross-rank hang)");
  compute().drain();
  host_memory().release(host_of(p, "release"));
}

void staged_zero(void* p, size_t bytes) {
  float* h = static_cast<float*>(host_of(p, "zero"));
  std::lock_guard lock(g_mu);
  compute().push([h, bytes] { std::memset(h, 0, bytes); });
}

void staged_upload(void* dst, const void* src, size_t bytes) {
  host_only(src, "upload (source)");
  char* d = static_cast<char*>(host_of(dst, "upload (destination)"));
  if (!bytes) return;
  // The source may be reused on return (as cudaMemcpyAsync from pageable memory): a copy.
  auto snapshot = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
  std::lock_guard lock(g_mu);
  compute().push([d, snapshot] { std::memcpy(d, snapshot->data(), snapshot->size()); });
}

void staged_download(void* dst, const void* src, size_t bytes) {
  host_only(dst, "download (destination)");
  const char* s = static_cast<const char*>(host_of(src, "download (source)"));
  std::lock_guard lock(g_mu);
  compute().drain();
  if (bytes) std::memcpy(dst, s, bytes);
}

void staged_copy(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(host_of(dst, "copy (destination)"));
  const char* s = static_cast<const char*>(host_of(src, "copy (source)"));
  if (d == s || !bytes) return;
  std::lock_guard lock(g_mu);
  compute().push([d, s, bytes] { std::memmove(d, s, bytes); });
}

void staged_synchronize() {
  std::lock_guard lock(g_mu);
  compute().drain();
}

// Snapshots as a download (the stream's ops run first): the copy is done when it returns, so
// the waits have nothing to wait for. What this checks is the callers' use of the slots and
// of separate memory.
void* staged_alloc_pinned(size_t bytes) { return ::operator new(bytes ? bytes : 64); }
void staged_free_pinned(void* p) { ::operator delete(p); }
void staged_snapshot_copy(void* dst, const void* src, size_t bytes, int) {
  staged_download(dst, src, bytes);
}
bool staged_snapshot_ready(int) { return true; }
void staged_snapshot_wait(int) {}

// ---- The ops ------------------------------------------------------------------------------
// Every pointer argument must be device memory (or null); the op runs on the host addresses,
// deferred when it returns nothing, else after everything queued before it (it returns a host
// value, as a GPU op that waits for its stream).
template <typename A>
auto on_host(A a, Op op) {
  if constexpr (std::is_pointer_v<A>)
    return host_of(a, op_name(op));
  else
    return a;
}

template <Op op, auto F>
struct Staged;
template <Op op, typename R, typename... A, R (*F)(A...)>
struct Staged<op, F> {
  static R call(A... a) {
    std::tuple<std::decay_t<A>...> args{on_host(a, op)...};
    std::lock_guard lock(g_mu);
    if constexpr (std::is_void_v<R>) {
      compute().push([args] { std::apply(F, args); });
    } else {
      compute().drain();
      return std::apply(F, args);
    }
  }
};

// A crash (host code reading device memory faults on the tag) prints the stack, so the test
// that meets it names the caller; then the default action (a core, the signal's exit status).
extern "C" void on_staged_fault(int sig) {
  static const char head[] =
      "strata: cpu-staged: crashed (host code reading or writing device memory faults on its "
      "tag: look for the first strata frame); the stack:\n";
  (void)!::write(2, head, sizeof head - 1);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Installed at every selection of the staged table, not once: a test framework that restores
// its own handlers after each test case would otherwise leave later selections without it.
void install_fault_handler() {
  static std::once_flag warmed;
  std::call_once(warmed, [] {
    void* warm[1];
    (void)::backtrace(warm, 1);  // loads libgcc's unwinder now: the handler must not load it
  });
  struct sigaction sa{};
  sa.sa_handler = on_staged_fault;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS}) sigaction(sig, &sa, nullptr);
}

// ---- The transport ------------------------------------------------------------------------
// The device communicator's stand-in transport: a stream of its own whose collectives are MPI
// calls (on a duplicate of the host comm, so their order is this stream's alone, as NCCL's
// communicator is its own) on the staged memory's host addresses.
class StagedTransport final : public DeviceTransport {
 public:
  explicit StagedTransport(Comm& host) {
    const bool wanted = host.size() > 1 || device_collectives_on_one_rank();
    if (!wanted || env_int("STRATA_STAGED_SHARED_DEVICE", 0, 1).value_or(0) == 1) return;
    dup_ = host.split(0, host.rank());
  }

  bool collectives() const override { return dup_ != nullptr; }

  Event new_event() override {
    events_.push_back({});
    return Event(events_.size() - 1);
  }
  void record_on_compute(Event e) override {
    std::lock_guard lock(g_mu);
    events_.at(size_t(e)) = {false, compute().issued};
  }
  void record_on_comm(Event e) override {
    std::lock_guard lock(g_mu);
    events_.at(size_t(e)) = {true, stream_.issued};
  }
  void comm_waits(Event e) override {
    const Mark m = events_.at(size_t(e));
    std::lock_guard lock(g_mu);
    // The compute stream runs on while the collectives' stream waits for it: here, the
    // compute items up to the mark run when this item is reached.
    auto reach = [this, m] {
      sync_to(m);
      return true;
    };
    stream_.push({reach, [reach] { reach(); }});
  }
  void compute_waits(Event e) override {
    const Mark m = events_.at(size_t(e));
    std::lock_guard lock(g_mu);
    compute().push([this, m] { sync_to(m); });
  }
  bool query(Event e) override {
    const Mark m = events_.at(size_t(e));
    std::lock_guard lock(g_mu);
    if (!m.comm) {
      compute().run_until(m.seq);
      return true;
    }
    return stream_.progress(m.seq);
  }
  void check_async_error() override {}

  void allreduce_sum(float* x, int64_t n) override {
    float* h = host_of(x, "the device communicator's allreduce");
    collective([this, h, n] { return dup_->start_allreduce_sum(h, n); });
  }
  void sharded(float* x, const std::vector<int64_t>& counts, bool reduce) override {
    float* h = host_of(x, "the device communicator's sharded collective");
    collective([this, h, counts, reduce] {
      return reduce ? dup_->start_reduce_scatter_sum(h, counts) : dup_->start_allgather(h, counts);
    });
  }
  void abandon() override {}

 private:
  struct Mark {
    bool comm = false;  // the collectives' stream, else compute
    int64_t seq = 0;
  };
  void sync_to(const Mark& m) {
    if (m.comm)
      stream_.run_until(m.seq);
    else
      compute().run_until(m.seq);
  }
  // A collective on the stream: started (on MPI) when the stream reaches it, then polled.
  void collective(std::function<int()> start) {
    struct State {
      bool started = false;
      int handle = -1;
    };
    auto st = std::make_shared<State>();
    auto begin = [this, st, start] {
      if (st->started) return;
      st->handle = start();
      st->started = true;
      ++g_in_flight;
    };
    auto poll = [this, st, begin] {
      begin();
      if (!dup_->test(st->handle)) return false;
      --g_in_flight;
      return true;
    };
    auto finish = [this, st, begin] {
      begin();
      dup_->wait(st->handle);
      --g_in_flight;
    };
    std::lock_guard lock(g_mu);
    stream_.push({poll, finish});
  }

  std::unique_ptr<Comm> dup_;
  CommStream stream_;
  std::vector<Mark> events_;
};

}  // namespace

const Backend& staged_backend(Precision precision) {
  static const Memory m{.name = "cpu-staged", .host = false, .alloc = staged_alloc,
                        .release = staged_release, .zero = staged_zero};
  auto make = [](Precision p) {
    // The CPU runs its ops, so layers size their work as for the CPU.
    Backend t{.name = "cpu-staged", .precision = p, .processor = Processor::cpu, .memory = &m,
              .upload = staged_upload, .download = staged_download, .copy = staged_copy,
              .synchronize = staged_synchronize};
    t.alloc_pinned = staged_alloc_pinned;
    t.free_pinned = staged_free_pinned;
    t.snapshot_copy = staged_snapshot_copy;
    t.snapshot_ready = staged_snapshot_ready;
    t.snapshot_device_wait = staged_snapshot_wait;
    // The CPU's ops, deferred (not its int8 ones: like a GPU's table, staged has none) ...
#define STRATA_OP(name, ret, params) t.name = &Staged<Op::name, &cpu::name>::call;
#define STRATA_CPU_OP(name, ret, params)
#include "strata/ops.def"
    // ... and in bf16 the CPU's bf16 precision ops in place of their fp32 ones.
    if (p == Precision::bf16) {
#define STRATA_BF16_OP(name) t.name = &Staged<Op::name, &cpu::bf16::name>::call;
      STRATA_PRECISION_OPS(STRATA_BF16_OP)
#undef STRATA_BF16_OP
    }
    return t;
  };
  static const Backend fp32 = make(Precision::fp32), b16 = make(Precision::bf16);
  install_fault_handler();
  return precision == Precision::bf16 ? b16 : fp32;
}

std::unique_ptr<DeviceTransport> staged_transport(Comm& host) {
  return std::make_unique<StagedTransport>(host);
}

namespace {

const Backend& make_staged(const DeviceRequest& req, Precision precision, BackendChoice* out) {
  start_cpu_math(req.threads, precision);
  out->why = "cpu-staged (the CPU ops as a GPU runs them: tagged device memory, deferred "
             "streams; for tests of the GPU path)";
  return staged_backend(precision);
}

}  // namespace

extern const BackendProvider kStagedProvider{.name = "cpu-staged", .what = "staged CPU",
                                             .in_auto = false, .available = always_available,
                                             .make = make_staged,
                                             .transport = staged_transport};

}  // namespace strata
