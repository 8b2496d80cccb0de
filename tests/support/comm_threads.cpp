#include "comm_threads.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "base/activity.h"
#include "strata/error.h"

namespace strata {
namespace {

constexpr int kMaxTag = 32767;  // the least MPI_TAG_UB MPI guarantees

// Shared by every communicator of one world, splits included. One lock and one condition
// variable for all: a handful of ranks contend little, and one cv lets abort wake everyone.
struct World {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> hosts;    // per world rank
  std::vector<std::string> waiting;  // per world rank: the blocking call it is in, "" if none
  std::string aborted;               // non-empty: every blocked call throws this
};

// Thrown in a rank woken because another rank failed or the run timed out.
struct RankAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One non-blocking operation; `done` is guarded by World::mu.
struct Request {
  bool done = false;
  virtual ~Request() = default;
};

// A point-to-point message: the send and the receive it matches share it.
struct Message : Request {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t n = 0;              // the count of whichever side came first
  bool sent = false, received = false;  // which sides have come (a buffer may be null)
};

enum class Op { kReduceScatter, kAllgather, kSumFloat, kSumDouble, kSumInt64, kMinInt64, kMaxDouble, kBroadcast, kBarrier, kSplit, kGatherText };

// One rank's part of a collective.
struct Part {
  void* buf = nullptr;
  int64_t n = 0;  // elements; bytes for a broadcast
  int root = 0;
  int color = 0, key = 0;
  std::shared_ptr<const std::vector<int64_t>> counts = nullptr;  // shards: per rank (the same on every rank)
};

struct Group;

// One collective call of every rank of a group: complete when the last rank has joined.
struct Round : Request {
  Op op;
  int64_t n;
  int root;
  std::vector<Part> parts;
  int joined = 0;
  std::vector<std::pair<std::shared_ptr<Group>, int>> split;  // per rank: its group and rank
  std::vector<std::string> texts;  // all_gather_text: per rank
};

// What the ranks of one communicator share: collectives in flight (by call number) and
// unmatched sends and receives per (from, to, tag), oldest first.
struct Group {
  std::vector<int> world_ranks;  // of each rank of the group
  std::map<uint64_t, std::shared_ptr<Round>> rounds;
  struct Queue {
    std::deque<std::shared_ptr<Message>> sends, recvs;
  };
  std::map<std::tuple<int, int, int>, Queue> queues;
};

std::string describe(Op op, int64_t n, int root) {
  switch (op) {
    case Op::kReduceScatter: return fmt::format("reduce_scatter_sum(float, {})", n);
    case Op::kAllgather: return fmt::format("allgather(float, {})", n);
    case Op::kSumFloat: return fmt::format("allreduce_sum(float, {})", n);
    case Op::kSumDouble: return fmt::format("allreduce_sum(double, {})", n);
    case Op::kSumInt64: return fmt::format("allreduce_sum(int64, {})", n);
    case Op::kMinInt64: return fmt::format("allreduce_min(int64, {})", n);
    case Op::kMaxDouble: return fmt::format("allreduce_max(double, {})", n);
    case Op::kBroadcast: return fmt::format("broadcast({} bytes, root {})", n, root);
    case Op::kBarrier: return "barrier()";
    case Op::kSplit: return "split()";
    case Op::kGatherText: return "all_gather_text()";
  }
  return "?";
}

// In rank order, element by element: the result of a serial loop over the ranks.
template <typename T, typename F>
void reduce(std::vector<Part>& parts, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    T acc = static_cast<T*>(parts[0].buf)[i];
    for (size_t r = 1; r < parts.size(); ++r) acc = f(acc, static_cast<T*>(parts[r].buf)[i]);
    for (Part& p : parts) static_cast<T*>(p.buf)[i] = acc;
  }
}

// Rank r's shard of every part, summed in rank order, into part r's shard.
void reduce_scatter(std::vector<Part>& parts) {
  int64_t at = 0;
  for (size_t r = 0; r < parts.size(); ++r) {
    const int64_t c = (*parts[r].counts)[r];
    for (int64_t i = at; i < at + c; ++i) {
      float acc = static_cast<float*>(parts[0].buf)[i];
      for (size_t q = 1; q < parts.size(); ++q) acc += static_cast<float*>(parts[q].buf)[i];
      static_cast<float*>(parts[r].buf)[i] = acc;
    }
    at += c;
  }
}

// Part r's shard into every other part.
void allgather(std::vector<Part>& parts) {
  int64_t at = 0;
  for (size_t r = 0; r < parts.size(); ++r) {
    const int64_t c = (*parts[r].counts)[r];
    for (size_t q = 0; q < parts.size(); ++q)
      if (q != r && c > 0)
        std::memcpy(static_cast<float*>(parts[q].buf) + at, static_cast<float*>(parts[r].buf) + at,
                    sizeof(float) * size_t(c));
    at += c;
  }
}

// New groups by color, ranks ordered by (key, parent rank), as MPI_Comm_split orders them.
void split_groups(Round& r, const Group& parent) {
  std::vector<int> order(r.parts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const Part &pa = r.parts[size_t(a)], &pb = r.parts[size_t(b)];
    return std::tie(pa.color, pa.key, a) < std::tie(pb.color, pb.key, b);
  });
  r.split.resize(r.parts.size());
  std::shared_ptr<Group> g;
  for (size_t i = 0; i < order.size(); ++i) {
    const int me = order[i];
    if (i == 0 || r.parts[size_t(me)].color != r.parts[size_t(order[i - 1])].color)
      g = std::make_shared<Group>();
    r.split[size_t(me)] = {g, int(g->world_ranks.size())};
    g->world_ranks.push_back(parent.world_ranks[size_t(me)]);
  }
}

// Run by the last rank to join, under the lock: every rank's buffer gets the result.
void complete(Round& r, const Group& g) {
  auto sum = [](auto a, auto b) { return a + b; };
  switch (r.op) {
    case Op::kSumFloat: reduce<float>(r.parts, r.n, sum); break;
    case Op::kSumDouble: reduce<double>(r.parts, r.n, sum); break;
    case Op::kSumInt64: reduce<int64_t>(r.parts, r.n, sum); break;
    case Op::kMinInt64: reduce<int64_t>(r.parts, r.n, [](int64_t a, int64_t b) { return std::min(a, b); }); break;
    case Op::kMaxDouble: reduce<double>(r.parts, r.n, [](double a, double b) { return std::max(a, b); }); break;
    case Op::kBroadcast:
      for (size_t i = 0; i < r.parts.size(); ++i)
        if (int(i) != r.root && r.n > 0) std::memcpy(r.parts[i].buf, r.parts[size_t(r.root)].buf, size_t(r.n));
      break;
    case Op::kSplit: split_groups(r, g); break;
    case Op::kReduceScatter: reduce_scatter(r.parts); break;
    case Op::kAllgather: allgather(r.parts); break;
    case Op::kGatherText:  // as MPI's fixed 256-byte slots keep them
      for (const Part& p : r.parts) r.texts.push_back(static_cast<const std::string*>(p.buf)->substr(0, 255));
      break;
    case Op::kBarrier: break;
  }
  r.done = true;
}

// Stops the world (caller holds its lock): every blocked call, and every later one, throws
// RankAborted.
void abort_locked(World& w, const std::string& why) {
  if (w.aborted.empty()) w.aborted = why;
  w.cv.notify_all();
}

void stop_world(World& w, const std::string& why) {
  std::lock_guard lk(w.mu);
  abort_locked(w, why);
}

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank)
      : world_(std::move(w)), group_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(group_->world_ranks.size()); }

  void allreduce_sum(float* x, int64_t n) override { reduce(Op::kSumFloat, x, n); }
  void allreduce_sum(double* x, int64_t n) override { reduce(Op::kSumDouble, x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { reduce(Op::kSumInt64, x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { reduce(Op::kMinInt64, x, n); }
  void allreduce_max(double* x, int64_t n) override { reduce(Op::kMaxDouble, x, n); }
  void broadcast(void* buf, int64_t bytes, int root) override {
    if (root < 0 || root >= size()) refuse(fmt::format("broadcast from rank {} of {}", root, size()));
    Blocked b(activity(), Activity::kBroadcast);
    collective(Op::kBroadcast, {.buf = buf, .n = bytes, .root = root});
  }
  void barrier() override {
    Blocked b(activity(), Activity::kBarrier);
    collective(Op::kBarrier, {});
  }

  int start_allreduce_sum(float* x, int64_t n) override {
    std::lock_guard lk(world_->mu);
    return keep({join(Op::kSumFloat, {.buf = x, .n = n}), "allreduce_sum", -1, -1, n});
  }
  int start_reduce_scatter_sum(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(Op::kReduceScatter, "reduce_scatter_sum", x, counts);
  }
  int start_allgather(float* x, const std::vector<int64_t>& counts) override {
    return start_sharded(Op::kAllgather, "allgather", x, counts);
  }
  int start_send(const float* x, int64_t n, int to, int tag) override;
  int start_recv(float* x, int64_t n, int from, int tag) override;
  bool test(int h) override;
  void wait(int h) override;
  std::unique_ptr<Comm> split(int color, int key) override;

  std::string host() const override { return world_->hosts[size_t(world_rank())]; }
  std::vector<std::string> all_gather_text(const std::string& mine) override {
    Blocked b(activity(), Activity::kAllreduce);
    return collective(Op::kGatherText, {.buf = const_cast<std::string*>(&mine)})->texts;
  }
  std::unique_ptr<SideChannel> open_side_channel(int, bool, std::string* why_not) override {
    *why_not = size() == 1 ? "one rank" : "in-process ranks (threads): no side channel";
    return nullptr;
  }

 private:
  // A handle's request and, for the error that names a hung rank, what it is.
  struct Pending {
    std::shared_ptr<Request> req;
    const char* what;
    int peer, tag;
    int64_t n;
  };

  int world_rank() const { return group_->world_ranks[size_t(rank_)]; }
  void reduce(Op op, void* x, int64_t n) {
    Blocked b(activity(), Activity::kAllreduce);
    collective(op, {.buf = x, .n = n});
  }
  std::shared_ptr<Round> collective(Op op, Part p) {
    std::unique_lock lk(world_->mu);
    auto r = join(op, p);
    block(lk, *r, [&] { return describe(op, p.n, p.root); });
    return r;
  }
  std::shared_ptr<Round> join(Op op, Part p);
  void deliver(Message& m, int64_t sent, int64_t received);
  template <typename What>
  void block(std::unique_lock<std::mutex>& lk, const Request& r, What what);
  // A misuse: the world stops first, so that no rank matches a buffer of this one's while
  // it unwinds; the others are woken with RankAborted. fail: under the lock; refuse: not.
  [[noreturn]] void fail(const std::string& msg) {
    abort_locked(*world_, msg);
    throw std::logic_error(msg);
  }
  [[noreturn]] void refuse(const std::string& msg) {
    stop_world(*world_, msg);
    throw std::logic_error(msg);
  }
  void check_open() const {
    if (!world_->aborted.empty()) throw RankAborted(world_->aborted);
  }
  void check_peer(int peer, int tag, int64_t n) {
    if (peer < 0 || peer >= size()) refuse(fmt::format("peer rank {} of {}", peer, size()));
    if (tag < 0 || tag > kMaxTag) refuse(fmt::format("tag {} outside [0, {}]", tag, kMaxTag));
    if (n < 0) refuse(fmt::format("a message of {} floats", n));
  }
  int keep(Pending p);
  int start_sharded(Op op, const char* what, float* x, const std::vector<int64_t>& counts) {
    if (int(counts.size()) != size())
      refuse(fmt::format("{} shard counts for a communicator of {} ranks", counts.size(), size()));
    int64_t n = 0;
    for (int64_t c : counts) {
      if (c < 0) refuse(fmt::format("a shard of {} floats", c));
      n += c;
    }
    std::lock_guard lk(world_->mu);
    Part p{.buf = x, .n = n, .counts = std::make_shared<const std::vector<int64_t>>(counts)};
    return keep({join(op, std::move(p)), what, -1, -1, n});
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
  uint64_t calls_ = 0;  // collectives called on this communicator: the next one's number
  std::vector<Pending> handles_;  // req null: free (MPI_REQUEST_NULL)
};

// Under the lock: this rank's part of its next collective; the last rank to join computes it.
std::shared_ptr<Round> ThreadComm::join(Op op, Part p) {
  check_open();
  const uint64_t call = calls_++;
  auto& slot = group_->rounds[call];
  if (!slot) {
    slot = std::make_shared<Round>();
    slot->op = op;
    slot->n = p.n;
    slot->root = p.root;
    slot->parts.resize(size_t(size()));
  } else if (slot->op != op || slot->n != p.n || slot->root != p.root) {
    fail(fmt::format("collective mismatch on a communicator of {} ranks: rank {} calls {} as "
                     "its collective #{}, where another rank called {}", size(), rank_,
                     describe(op, p.n, p.root), call, describe(slot->op, slot->n, slot->root)));
  }
  std::shared_ptr<Round> r = slot;
  r->parts[size_t(rank_)] = p;
  if (++r->joined == size()) {
    complete(*r, *group_);
    group_->rounds.erase(call);
    world_->cv.notify_all();
  }
  return r;
}

// Under the lock: sleeps until r is done; throws RankAborted if the world stops first.
template <typename What>
void ThreadComm::block(std::unique_lock<std::mutex>& lk, const Request& r, What what) {
  if (r.done) return;
  std::string& mine = world_->waiting[size_t(world_rank())];
  mine = fmt::format("{} (rank {} of {} in that communicator)", what(), rank_, size());
  world_->cv.wait(lk, [&] { return r.done || !world_->aborted.empty(); });
  mine.clear();
  if (!r.done) throw RankAborted(world_->aborted);
}

int ThreadComm::keep(Pending p) {
  for (size_t i = 0; i < handles_.size(); ++i)
    if (!handles_[i].req) {
      handles_[i] = std::move(p);
      return int(i);
    }
  handles_.push_back(std::move(p));
  return int(handles_.size() - 1);
}

// Under the lock: a send and a receive meet; the receiver's buffer gets the data.
void ThreadComm::deliver(Message& m, int64_t sent, int64_t received) {
  if (sent != received)
    fail(fmt::format("a send of {} floats met a receive of {} (MPI would truncate the message "
                     "or leave part of the buffer unwritten)", sent, received));
  if (m.n > 0) std::memcpy(m.dst, m.src, size_t(m.n) * sizeof(float));
  m.done = true;
  world_->cv.notify_all();
}

// Both the send and the receive of a message hold it; the second of them to come delivers it.
int ThreadComm::start_send(const float* x, int64_t n, int to, int tag) {
  check_peer(to, tag, n);
  std::lock_guard lk(world_->mu);
  check_open();
  auto& q = group_->queues[{rank_, to, tag}];
  std::shared_ptr<Message> m;
  if (q.recvs.empty()) {
    m = std::make_shared<Message>();
    m->n = n;
    q.sends.push_back(m);
  } else {
    m = q.recvs.front();
    q.recvs.pop_front();
  }
  m->src = x;
  m->sent = true;
  if (m->received) deliver(*m, n, m->n);
  return keep({m, "send", to, tag, n});
}

int ThreadComm::start_recv(float* x, int64_t n, int from, int tag) {
  check_peer(from, tag, n);
  std::lock_guard lk(world_->mu);
  check_open();
  auto& q = group_->queues[{from, rank_, tag}];
  std::shared_ptr<Message> m;
  if (q.sends.empty()) {
    m = std::make_shared<Message>();
    m->n = n;
    q.recvs.push_back(m);
  } else {
    m = q.sends.front();
    q.sends.pop_front();
  }
  m->dst = x;
  m->received = true;
  if (m->sent) deliver(*m, m->n, n);
  return keep({m, "receive", from, tag, n});
}

bool ThreadComm::test(int h) {
  STRATA_CHECK(h >= 0 && size_t(h) < handles_.size(), "handle {} of {}", h, handles_.size());
  Pending& p = handles_[size_t(h)];
  if (!p.req) return true;
  std::lock_guard lk(world_->mu);
  if (!p.req->done) return false;
  p.req.reset();
  return true;
}

void ThreadComm::wait(int h) {
  STRATA_CHECK(h >= 0 && size_t(h) < handles_.size(), "handle {} of {}", h, handles_.size());
  Blocked b(activity(), Activity::kWait);
  Pending& p = handles_[size_t(h)];
  if (!p.req) return;
  std::unique_lock lk(world_->mu);
  block(lk, *p.req, [&] {
    return p.peer < 0 ? fmt::format("wait for a non-blocking {}(float, {})", p.what, p.n)
                      : fmt::format("wait for a {} of {} floats {} rank {}, tag {}", p.what, p.n,
                                    p.what[0] == 's' ? "to" : "from", p.peer, p.tag);
  });
  p.req.reset();
}

std::unique_ptr<Comm> ThreadComm::split(int color, int key) {
  if (color < 0) refuse(fmt::format("split color {}: MPI takes colors >= 0", color));
  auto r = collective(Op::kSplit, {.color = color, .key = key});
  auto [group, rank] = r->split[size_t(rank_)];
  auto c = std::make_unique<ThreadComm>(world_, group, rank);
  c->parent_ = this;  // the watchdog marks are this comm's, as for MpiComm
  return c;
}

std::shared_ptr<World> new_world(int n, std::vector<std::string> hosts) {
  STRATA_CHECK(n >= 1, "{} ranks", n);
  STRATA_CHECK(hosts.empty() || int(hosts.size()) == n, "{} host names for {} ranks", hosts.size(), n);
  auto w = std::make_shared<World>();
  w->hosts = hosts.empty() ? std::vector<std::string>(size_t(n), "thread-host") : std::move(hosts);
  w->waiting.resize(size_t(n));
  return w;
}

std::vector<std::unique_ptr<Comm>> comms_of(const std::shared_ptr<World>& w) {
  auto g = std::make_shared<Group>();
  for (size_t r = 0; r < w->hosts.size(); ++r) g->world_ranks.push_back(int(r));
  std::vector<std::unique_ptr<Comm>> comms;
  for (size_t r = 0; r < w->hosts.size(); ++r) comms.push_back(std::make_unique<ThreadComm>(w, g, int(r)));
  return comms;
}

// One line per rank: finished, blocked in a call (which), or running outside the comm.
std::string where_ranks_are(World& w, const std::vector<bool>& finished) {
  std::lock_guard lk(w.mu);
  std::string out;
  for (size_t r = 0; r < finished.size(); ++r)
    out += fmt::format("\n  rank {}: {}", r, finished[r] ? "finished"
                                             : !w.waiting[r].empty() ? "blocked in " + w.waiting[r]
                                                                     : "running, not in the comm");
  return out;
}

}  // namespace

std::vector<std::unique_ptr<Comm>> make_thread_comms(int n, std::vector<std::string> hosts) {
  return comms_of(new_world(n, std::move(hosts)));
}

void run_ranks(int n, const std::function<void(Comm&)>& fn, const RanksOptions& opt) {
  auto world = new_world(n, opt.hosts);
  auto comms = comms_of(world);
  std::mutex mu;  // guards the three below
  std::condition_variable cv;
  std::vector<bool> finished(size_t(n), false);
  int running = n;
  std::exception_ptr first;  // the first failure that is not another's consequence
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*comms[size_t(r)]);
      } catch (const RankAborted&) {  // woken by another rank's failure or the timeout
      } catch (...) {
        {
          std::lock_guard lk(mu);
          if (!first) first = std::current_exception();
        }
        stop_world(*world, fmt::format("rank {} failed", r));
      }
      std::lock_guard lk(mu);
      finished[size_t(r)] = true;
      --running;
      cv.notify_all();
    });
  std::unique_lock lk(mu);
  const bool in_time = cv.wait_for(lk, std::chrono::duration<double>(opt.timeout_s),
                                   [&] { return running == 0; });
  std::string hung;
  if (!in_time) {
    hung = where_ranks_are(*world, finished);
    stop_world(*world, fmt::format("run_ranks timed out after {} s", opt.timeout_s));
    // A rank stuck outside the comm cannot be woken, nor its thread left behind (its frames
    // hold what other threads point to): end the process rather than hang the test run.
    if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return running == 0; })) {
      std::fprintf(stderr, "run_ranks: ranks still running 10 s after the timeout:%s\n", hung.c_str());
      std::abort();
    }
  }
  lk.unlock();
  for (auto& t : threads) t.join();
  if (!in_time)
    throw std::runtime_error(fmt::format("run_ranks: {} ranks did not finish within {} s:{}", n,
                                         opt.timeout_s, hung));
  if (first) std::rethrow_exception(first);
}

}  // namespace strata
