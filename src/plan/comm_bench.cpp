#include "plan/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "base/job.h"
#include "base/parse.h"
#include "base/stats.h"
#include "strata/backend.h"
#include "strata/error.h"
#include "strata/version.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// Rank r's value at index i: a small integer (1..16), so that a sum over up to 2^20 ranks is
// exact in fp32 and any order of addition gives the same bits; it depends on the rank and the
// index, so a shard or message that lands in the wrong place is caught.
float pattern(int rank, int64_t i) { return float((i + 3 * int64_t(rank)) % 16 + 1); }

// n floats in the backend's memory (host memory on the CPU).
class Buffer {
 public:
  Buffer(const Backend& be, int64_t n) : be_(be), p_(static_cast<float*>(be.memory->alloc(size_t(n) * 4))) {}
  ~Buffer() { be_.memory->release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() const { return p_; }
  void upload(const std::vector<float>& h, int64_t n) { be_.upload(p_, h.data(), size_t(n) * 4); }
  void download(std::vector<float>& h, int64_t n) const { be_.download(h.data(), p_, size_t(n) * 4); }

 private:
  const Backend& be_;
  float* p_;
};

// Shards of n floats over `ranks` as even as they go (the first n % ranks one larger).
std::vector<int64_t> shard_counts(int64_t n, int ranks) {
  std::vector<int64_t> c(size_t(ranks), n / ranks);
  for (int64_t r = 0; r < n % ranks; ++r) ++c[size_t(r)];
  return c;
}

// STRATA_BENCH_COMM_CORRUPT=OP:RANK (test hook; see comm_bench.h).
struct Corruption {
  std::string op;
  int rank = -1;
};
Corruption corruption_hook() {
  const char* v = std::getenv("STRATA_BENCH_COMM_CORRUPT");
  Corruption c;
  if (!v || !*v) return c;
  const std::string s = v;
  const size_t colon = s.find(':');
  std::string why;
  const auto rank = colon == std::string::npos ? std::nullopt : parse_int(s.substr(colon + 1), &why);
  if (!rank || *rank < 0)
    throw UserError(kExitBadInput, fmt::format("STRATA_BENCH_COMM_CORRUPT={}: expected OP:RANK", s));
  c.op = s.substr(0, colon);
  c.rank = int(*rank);
  return c;
}

struct Level {
  std::string name;  // intra | inter
  std::unique_ptr<Comm> comm;
  int ranks = 0;  // the communicator's size on world rank 0 (what the figures describe)
};

class CommBench {
 public:
  CommBench(Comm& world, const CommBenchOptions& o, const Backend& be, Corruption corrupt)
      : world_(world), o_(o), corrupt_(std::move(corrupt)),
        a_(be, o.max_bytes / 4), b_(be, o.max_bytes / 4), host_(size_t(o.max_bytes / 4)) {}

  // Every op at every size on each level, the whole sweep `rounds` times; rank 0 keeps the
  // median of the rounds' figures in p.measurements (a shared machine's slow moment then spoils
  // one round's figures of a few sizes, not the profile's; on a 2-vCPU VM whose slow modes last
  // seconds, longer than a sweep, only separate launches part them: bench_plan_accuracy.py).
  void run(CommProfile& p, const std::vector<Level>& levels) {
    int sizes = 0;
    for (int64_t b = o_.min_bytes; b <= o_.max_bytes; b *= 2) ++sizes;
    const int per_round = sizes * int(o_.ops.size()) * int(levels.size());
    const int rounds = std::max(1, o_.rounds);
    if (world_.rank() == 0) fmt::print("{}\n", comm_table_header());
    std::vector<std::vector<double>> times(static_cast<size_t>(per_round));
    int done = 0;
    for (int round = 0; round < rounds; ++round) {
      size_t k = 0;
      for (const auto& level : levels)
        for (CommOp op : o_.ops)
          for (int64_t bytes = o_.min_bytes; bytes <= o_.max_bytes; bytes *= 2, ++k) {
            level_ = level.name;
            CommMeasurement m = measure(*level.comm, op, bytes);
            m.ranks = op == CommOp::sendrecv ? 2 : level.ranks;
            ++done;
            if (world_.rank() != 0) continue;
            times[k].push_back(m.time_s);
            if (o_.progress)
              fmt::print(stderr, "bench comm: [{}/{}] {}{} {} {} B: {:.2f} us, busbw {:.3f} GB/s\n", done,
                         per_round * rounds, rounds > 1 ? fmt::format("round {}/{}: ", round + 1, rounds) : "",
                         level.name, comm_op_name(op), bytes, m.time_s * 1e6, m.busbw_Bps() / 1e9);
            if (round + 1 < rounds) continue;
            m.time_s = median(times[k]);
            p.measurements.push_back(m);
            fmt::print("{}\n", comm_table_row(m));
          }
    }
  }

 private:
  // Times one op at one size: warmup, then iters timed one by one; an iteration's time is the
  // slowest rank's (every rank of the world: all groups of a level run at once), the figure
  // the median of those. Then one checked call.
  CommMeasurement measure(Comm& c, CommOp op, int64_t bytes) {
    const int64_t n = bytes / 4;
    std::vector<double> times(size_t(o_.iters), 0.0);
    fill(c, op, n, /*checked=*/false);
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      const double t = op == CommOp::sendrecv ? ping_pong(c, n) : collective(c, op, n);
      if (it >= o_.warmup) times[size_t(it - o_.warmup)] = t;
    }
    world_.allreduce_max(times.data(), int64_t(times.size()));
    check(c, op, n, bytes);
    return {.op = op, .level = level_, .ranks = 0, .bytes = bytes, .time_s = median(times)};
  }

  double collective(Comm& c, CommOp op, int64_t n) {
    c.barrier();  // every rank starts together, as OSU's collective benchmarks do
    const auto t0 = Clock::now();
    start_and_wait(c, op, n);
    return seconds_since(t0);
  }

  void start_and_wait(Comm& c, CommOp op, int64_t n) {
    float* x = a_.get();
    int h = 0;
    if (op == CommOp::allreduce_blocking) return c.allreduce_sum(x, n);
    if (op == CommOp::allreduce) h = c.start_allreduce_sum(x, n);
    if (op == CommOp::reduce_scatter) h = c.start_reduce_scatter_sum(x, shard_counts(n, c.size()));
    if (op == CommOp::all_gather) h = c.start_allgather(x, shard_counts(n, c.size()));
    c.wait(h);
  }

  // Ranks i and i + m/2 of the level's communicator (m its size; an odd one out idles): i sends
  // n floats, its partner receives them and sends n back. The time is half the round trip,
  // taken on i (osu_latency's definition); the partner reports 0, so the max is i's.
  int partner(const Comm& c) const {
    const int half = c.size() / 2, r = c.rank();
    return r < half ? r + half : r < 2 * half ? r - half : -1;
  }
  double ping_pong(Comm& c, int64_t n) {
    const int peer = partner(c);
    if (peer < 0) return 0;
    constexpr int kTag = 4242;
    if (c.rank() < peer) {
      const auto t0 = Clock::now();
      c.wait(c.start_send(a_.get(), n, peer, kTag));
      c.wait(c.start_recv(b_.get(), n, peer, kTag));
      return seconds_since(t0) / 2;
    }
    c.wait(c.start_recv(b_.get(), n, peer, kTag));
    c.wait(c.start_send(a_.get(), n, peer, kTag));
    return 0;
  }

  // The inputs: this rank's pattern (all-gather: in its own shard, -1 elsewhere; send/receive:
  // -1 in the receive buffer). checked: the test hook may add 1 to the last element.
  void fill(const Comm& c, CommOp op, int64_t n, bool checked) {
    const int r = c.rank();
    int64_t lo = 0, hi = n;
    if (op == CommOp::all_gather) shard_range(c, n, r, &lo, &hi);
    for (int64_t i = 0; i < n; ++i) host_[size_t(i)] = i >= lo && i < hi ? pattern(r, i) : -1.0f;
    if (checked && corrupt_.rank == world_.rank() && corrupt_.op == comm_op_name(op)) {
      const int64_t i = op == CommOp::all_gather ? hi - 1 : n - 1;
      if (i >= lo) host_[size_t(i)] += 1;
    }
    a_.upload(host_, n);
    if (op == CommOp::sendrecv) {
      std::fill_n(host_.begin(), n, -1.0f);
      b_.upload(host_, n);
    }
  }

  static void shard_range(const Comm& c, int64_t n, int owner, int64_t* lo, int64_t* hi) {
    const auto counts = shard_counts(n, c.size());
    *lo = 0;
    for (int q = 0; q < owner; ++q) *lo += counts[size_t(q)];
    *hi = *lo + counts[size_t(owner)];
  }

  // One call on fresh inputs, its result read back and compared on every rank; the ranks
  // agree on the first failure (collectively), so none waits for ever.
  void check(Comm& c, CommOp op, int64_t n, int64_t bytes) {
    fill(c, op, n, /*checked=*/true);
    if (op == CommOp::sendrecv)
      ping_pong(c, n);
    else
      start_and_wait(c, op, n);
    collectively(world_, [&] {
      int64_t lo = 0, hi = n;
      if (op == CommOp::sendrecv && partner(c) < 0) return;
      (op == CommOp::sendrecv ? b_ : a_).download(host_, n);
      if (op == CommOp::reduce_scatter) shard_range(c, n, c.rank(), &lo, &hi);
      const auto counts = shard_counts(n, c.size());
      int owner = 0;
      int64_t owner_end = counts[0];
      for (int64_t i = lo; i < hi; ++i) {
        float want = 0;
        if (op != CommOp::all_gather && op != CommOp::sendrecv) {  // the sums
          for (int q = 0; q < c.size(); ++q) want += pattern(q, i);
        } else if (op == CommOp::all_gather) {
          while (i >= owner_end) owner_end += counts[size_t(++owner)];
          want = pattern(owner, i);
        } else {
          want = pattern(partner(c), i);
        }
        if (host_[size_t(i)] != want)
          throw UserError(kExitInternal,
                          fmt::format("bench comm: {} of {} bytes ({}, {} ranks) gave a wrong "
                                      "result at index {}: {} where {} was expected",
                                      comm_op_name(op), bytes, level_, c.size(), i,
                                      host_[size_t(i)], want));
      }
    });
  }

  Comm& world_;
  const CommBenchOptions& o_;
  Corruption corrupt_;
  Buffer a_, b_;  // the data; b_: what send/receive receives
  std::vector<float> host_;  // inputs and results on their way to and from a_ and b_
  std::string level_;  // the level measured, for messages
};

}  // namespace

void check_comm_bench_options(const CommBenchOptions& o, int ranks) {
  for (auto [v, flag] : {std::pair{o.min_bytes, "--min_bytes"}, std::pair{o.max_bytes, "--max_bytes"}})
    if (!power_of_two(v) || v < 4)
      throw UserError(kExitBadInput,
                      fmt::format("flag {}: {} bytes is not a power of 2 of at least 4 (one float)",
                                  flag, v));
  if (o.min_bytes > o.max_bytes)
    throw UserError(kExitBadInput, fmt::format("flag --min_bytes: {} is more than --max_bytes {}",
                                               o.min_bytes, o.max_bytes));
  if (o.ops.empty()) throw UserError(kExitBadInput, "flag --ops: no op given");
  if (ranks < 2)
    throw UserError(kExitBadInput,
                    "bench comm: 1 rank: the collectives and send/receive need at least 2; "
                    "launch it with mpirun -n 2 (or srun) or more");
}

CommProfile run_comm_bench(Comm& world, const CommBenchOptions& o) {
  check_comm_bench_options(o, world.size());
  std::string why;
  const Backend* be = nullptr;
  Corruption corrupt;
  collectively(world, [&] {
    corrupt = corruption_hook();
    be = &select_backend({.device = o.device, .threads = 1}, &why);
  });
  // The ranks' nodes, in order of first appearance, and each rank's index on its node.
  const auto names = world.all_gather_text(slurm_node_name());
  std::vector<std::string> nodes;
  std::vector<int> node_of, local_of, on_node;
  for (const auto& name : names) {
    auto it = std::find(nodes.begin(), nodes.end(), name);
    if (it == nodes.end()) {
      nodes.push_back(name);
      on_node.push_back(0);
      it = nodes.end() - 1;
    }
    const int k = int(it - nodes.begin());
    node_of.push_back(k);
    local_of.push_back(on_node[size_t(k)]++);
  }
  const int me = world.rank();
  CommProfile p;
  p.date = utc_now_iso();
  p.host = world.host();
  p.strata_version = fmt::format("strata {} ({})", STRATA_VERSION, git_commit());
  p.device = be->name;
  p.ranks = world.size();
  p.nodes = int(nodes.size());
  p.ranks_per_node = on_node[0];
  p.iters = o.iters;
  p.warmup = o.warmup;
  p.rounds = std::max(1, o.rounds);
  // The communicators: a duplicate of the world over the device's memory, split by node
  // (intra: every node's ranks at once) and by index on the node (inter: one rank of each
  // node; every index's group at once, as data parallelism across nodes runs).
  auto base = make_device_comm(world.split(0, me), *be);
  std::vector<Level> levels;
  const int most_on_a_node = *std::max_element(on_node.begin(), on_node.end());
  for (const char* name : {"intra", "inter"}) {
    const bool intra = name == std::string("intra");
    if (intra ? most_on_a_node < 2 : nodes.size() < 2) continue;
    Level l{.name = name, .comm = base->split(intra ? node_of[size_t(me)] : local_of[size_t(me)], me)};
    int64_t size = l.comm->size();
    world.broadcast(&size, sizeof size, 0);
    l.ranks = int(size);
    levels.push_back(std::move(l));
  }
  // "nccl" where every level's sums run on NCCL (ranks sharing a GPU stage theirs over MPI).
  p.backend = levels.empty() ? "mpi" : levels[0].comm->sums_library();
  for (const auto& l : levels)
    if (l.comm->sums_library() != p.backend) p.backend = "mpi";
  CommBench(world, o, *be, corrupt).run(p, levels);
  return p;
}

}  // namespace strata
