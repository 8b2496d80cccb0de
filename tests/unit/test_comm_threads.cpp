// The in-process communicator (comm_threads.h) over 1..4 ranks and sizes including 0: exact
// values against serial loops, MPI's ordering and handle rules, and failures that end the
// test instead of hanging it.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "ranks_util.h"
#include "run/watchdog.h"

using namespace strata;
using namespace strata::test;

namespace {

const int kRanks[] = {1, 2, 3, 4};
const int64_t kSizes[] = {0, 1, 7, 1000};

// Rank r's element i: magnitudes from 1e-3 to 1e7, so a float sum depends on its order.
float value(int r, int64_t i) {
  const uint64_t h = (uint64_t(r) * 2654435761u + uint64_t(i) * 40503u + 17) % 1000003u;
  const float scale[] = {1e-3f, 1.0f, 1e3f, 1e7f};
  return float(int64_t(h % 2001) - 1000) * scale[h % 4];
}

std::vector<float> values(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(r, i);
  return v;
}

// The sum of every rank's values, in the order given.
std::vector<float> serial_sum(int ranks, int64_t n, bool reversed = false) {
  std::vector<float> acc = values(reversed ? ranks - 1 : 0, n);
  for (int k = 1; k < ranks; ++k) {
    const auto v = values(reversed ? ranks - 1 - k : k, n);
    for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += v[size_t(i)];
  }
  return acc;
}

}  // namespace

TEST_CASE("thread comm: float sums equal the serial sum in rank order, bit for bit", "[ranks]") {
  // The data is order-sensitive: summed in reverse rank order it differs (so the check below
  // can fail for a comm that adds in another order).
  CHECK_FALSE(same_bits(serial_sum(3, 1000), serial_sum(3, 1000, true)));
  for (int n : kRanks)
    for (int64_t size : kSizes) {
      INFO(n << " ranks, " << size << " floats");
      auto got = on_ranks(n, [&](Comm& c) {
        auto v = values(c.rank(), size);
        c.allreduce_sum(v.data(), size);
        return v;
      });
      for (auto& v : got) CHECK(same_bits(v, serial_sum(n, size)));
    }
}

TEST_CASE("thread comm: double and int64 sums, int64 min and double max are exact", "[ranks]") {
  for (int n : kRanks)
    for (int64_t size : kSizes) {
      INFO(n << " ranks, " << size << " elements");
      struct Out {
        std::vector<double> sum_d, max_d;
        std::vector<int64_t> sum_i, min_i;
      };
      auto got = on_ranks(n, [&](Comm& c) {
        Out o;
        for (int64_t i = 0; i < size; ++i) {
          o.sum_d.push_back(double(value(c.rank(), i)) / 3.0);
          o.max_d.push_back(double(value(c.rank(), i)));
          o.sum_i.push_back((int64_t(1) << 40) * (c.rank() + 1) + i);
          o.min_i.push_back(int64_t(value(c.rank(), i)));
        }
        c.allreduce_sum(o.sum_d.data(), size);
        c.allreduce_max(o.max_d.data(), size);
        c.allreduce_sum(o.sum_i.data(), size);
        c.allreduce_min(o.min_i.data(), size);
        return o;
      });
      Out ref;
      for (int64_t i = 0; i < size; ++i) {
        double s = 0, mx = -INFINITY;
        int64_t si = 0, mn = INT64_MAX;
        for (int r = 0; r < n; ++r) {
          s = r == 0 ? double(value(r, i)) / 3.0 : s + double(value(r, i)) / 3.0;
          mx = std::max(mx, double(value(r, i)));
          si += (int64_t(1) << 40) * (r + 1) + i;
          mn = std::min(mn, int64_t(value(r, i)));
        }
        ref.sum_d.push_back(s);
        ref.max_d.push_back(mx);
        ref.sum_i.push_back(si);
        ref.min_i.push_back(mn);
      }
      for (auto& o : got) {
        CHECK(same_bits(o.sum_d, ref.sum_d));
        CHECK(same_bits(o.max_d, ref.max_d));
        CHECK(o.sum_i == ref.sum_i);
        CHECK(o.min_i == ref.min_i);
      }
    }
}

TEST_CASE("thread comm: broadcast from every root reaches every rank", "[ranks]") {
  for (int n : kRanks)
    for (int64_t bytes : {int64_t(0), int64_t(1), int64_t(13), int64_t(4096)})
      for (int root = 0; root < n; ++root) {
        INFO(n << " ranks, " << bytes << " bytes from rank " << root);
        auto pattern = [&](int r) {
          std::vector<uint8_t> b(static_cast<size_t>(bytes));
          for (int64_t i = 0; i < bytes; ++i) b[size_t(i)] = uint8_t(i * 31 + r * 7 + 1);
          return b;
        };
        auto got = on_ranks(n, [&](Comm& c) {
          auto b = pattern(c.rank());
          c.broadcast(b.data(), bytes, root);
          return b;
        });
        for (auto& b : got) CHECK(b == pattern(root));
      }
}

TEST_CASE("thread comm: no rank leaves a barrier before every rank has entered it", "[ranks]") {
  for (int n : kRanks) {
    std::atomic<int> entered{0};
    auto seen = on_ranks(n, [&](Comm& c) {
      std::vector<int> s;
      for (int k = 1; k <= 20; ++k) {
        entered++;
        c.barrier();
        s.push_back(entered.load());  // at least every rank's k-th entry
        c.barrier();                  // and none of the (k+1)-th yet
      }
      return s;
    });
    for (auto& s : seen)
      for (int k = 1; k <= 20; ++k) CHECK(s[size_t(k - 1)] == n * k);
  }
}

TEST_CASE("thread comm: split groups by color, ordered by key then rank, nested", "[ranks]") {
  struct Out {
    int size = 0, rank = 0, sub_size = 0, sub_rank = 0;
    int64_t sum = 0, sub_sum = 0;
    std::vector<std::string> hosts;
  };
  for (int n : kRanks) {
    INFO(n << " ranks");
    RanksOptions opt;
    for (int r = 0; r < n; ++r) opt.hosts.push_back("node" + std::to_string(r / 2));
    auto got = on_ranks(n, [&](Comm& c) {
      Out o;
      // Two colors; keys reverse the order within a color.
      auto half = c.split(c.rank() % 2, -c.rank());
      o.size = half->size();
      o.rank = half->rank();
      o.sum = c.rank();
      half->allreduce_sum(&o.sum, 1);
      o.hosts = half->all_hosts();
      // Nested: the halves split again, equal keys (order by parent rank), one color.
      auto again = half->split(7, 0);
      o.sub_size = again->size();
      o.sub_rank = again->rank();
      o.sub_sum = int64_t(1) << c.rank();
      again->allreduce_sum(&o.sub_sum, 1);
      return o;
    }, opt);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      const Out& o = got[size_t(r)];
      std::vector<int> members;  // same color, in key order (descending rank)
      for (int q = n - 1; q >= 0; --q)
        if (q % 2 == r % 2) members.push_back(q);
      CHECK(o.size == int(members.size()));
      CHECK(members[size_t(o.rank)] == r);
      CHECK(o.sum == std::accumulate(members.begin(), members.end(), int64_t(0)));
      std::vector<std::string> hosts;
      int64_t bits = 0;
      for (int q : members) {
        hosts.push_back("node" + std::to_string(q / 2));
        bits |= int64_t(1) << q;
      }
      CHECK(o.hosts == hosts);
      CHECK(o.sub_size == o.size);
      CHECK(o.sub_rank == o.rank);
      CHECK(o.sub_sum == bits);
    }
  }
}

TEST_CASE("thread comm: messages per (sender, tag) arrive in the order sent, any size", "[ranks]") {
  // Every rank sends 3 messages per tag (2 tags) to every rank, itself included; receivers post
  // tag 1 before tag 0 and, on odd ranks, only after their sends (both ways of matching).
  const int kTags = 2, kPerTag = 3;
  auto msg_size = [](int from, int to, int tag, int k) { return int64_t((from + to + tag + k) % 4 == 0 ? 0 : 1 + (from * 5 + to * 3 + k) % 9); };
  auto content = [](int from, int to, int tag, int k, int64_t i) { return float(from * 1000 + to * 100 + tag * 10 + k) + float(i) / 64; };
  for (int n : kRanks) {
    INFO(n << " ranks");
    auto ok = on_ranks(n, [&](Comm& c) {
      const int me = c.rank();
      std::vector<std::vector<float>> out, in;
      std::vector<int> handles;
      auto post_sends = [&] {
        for (int to = 0; to < n; ++to)
          for (int tag = 0; tag < kTags; ++tag)
            for (int k = 0; k < kPerTag; ++k) {
              auto& b = out.emplace_back(size_t(msg_size(me, to, tag, k)));
              for (size_t i = 0; i < b.size(); ++i) b[i] = content(me, to, tag, k, int64_t(i));
              handles.push_back(c.start_send(b.data(), int64_t(b.size()), to, tag));
            }
      };
      out.reserve(size_t(n * kTags * kPerTag));
      in.reserve(size_t(n * kTags * kPerTag));
      if (me % 2 == 1) post_sends();
      for (int from = 0; from < n; ++from)
        for (int tag = kTags - 1; tag >= 0; --tag)
          for (int k = 0; k < kPerTag; ++k) {
            auto& b = in.emplace_back(size_t(msg_size(from, me, tag, k)), -1.0f);
            handles.push_back(c.start_recv(b.data(), int64_t(b.size()), from, tag));
          }
      if (me % 2 == 0) post_sends();
      for (int h : handles) c.wait(h);
      int good = 1;
      size_t at = 0;
      for (int from = 0; from < n; ++from)
        for (int tag = kTags - 1; tag >= 0; --tag)
          for (int k = 0; k < kPerTag; ++k, ++at)
            for (size_t i = 0; i < in[at].size(); ++i)
              good = good && in[at][i] == content(from, me, tag, k, int64_t(i));
      return good;
    });
    for (int g : ok) CHECK(g == 1);
  }
}

TEST_CASE("thread comm: a send completes only when its receive takes it (rendezvous)", "[ranks]") {
  auto got = on_ranks(2, [&](Comm& c) {
    std::vector<bool> seen;
    float x = 42, y = 0;
    if (c.rank() == 0) {
      int h = c.start_send(&x, 1, 1, 5);
      seen.push_back(c.test(h));  // rank 1 posts its receive only after the barrier
      c.barrier();
      c.wait(h);
      seen.push_back(c.test(h));  // a completed handle tests true again
    } else {
      c.barrier();
      int h = c.start_recv(&y, 1, 0, 5);
      c.wait(h);
      seen.push_back(y == 42);
    }
    return seen;
  });
  CHECK(got[0] == std::vector<bool>{false, true});
  CHECK(got[1] == std::vector<bool>{true});
}

TEST_CASE("thread comm: a non-blocking sum completes when the last rank starts it", "[ranks]") {
  for (int n : {2, 3, 4})
    for (int64_t size : kSizes) {
      INFO(n << " ranks, " << size << " floats");
      struct Out {
        bool before = true, after = false;
        std::vector<float> a, b, c;
        double blocking = 0;
      };
      auto got = on_ranks(n, [&](Comm& c) {
        Out o;
        o.a = values(c.rank(), size);
        o.b = values(c.rank() + 1, size + 3);
        o.c = values(c.rank(), 0);
        float go = 1;
        if (c.rank() == 0) {
          const int h = c.start_allreduce_sum(o.a.data(), size);
          o.before = c.test(h);  // the others start only when told to, below
          std::vector<int> sends;
          for (int r = 1; r < n; ++r) sends.push_back(c.start_send(&go, 1, r, 0));
          const int h2 = c.start_allreduce_sum(o.b.data(), size + 3);
          const int h3 = c.start_allreduce_sum(o.c.data(), 0);
          // A blocking collective while these are in flight matches by call order.
          o.blocking = 1;
          c.allreduce_sum(&o.blocking, 1);
          for (int h : {h3, h2, h}) c.wait(h);  // any order
          for (int s : sends) c.wait(s);
          o.after = c.test(h);
        } else {
          c.wait(c.start_recv(&go, 1, 0, 0));
          const int h = c.start_allreduce_sum(o.a.data(), size);
          const int h2 = c.start_allreduce_sum(o.b.data(), size + 3);
          const int h3 = c.start_allreduce_sum(o.c.data(), 0);
          o.blocking = 1;
          c.allreduce_sum(&o.blocking, 1);
          while (!c.test(h2)) {}  // test() alone makes progress to completion
          c.wait(h);
          c.wait(h3);
          o.before = false;
          o.after = c.test(h);
        }
        return o;
      });
      CHECK_FALSE(got[0].before);
      for (auto& o : got) {
        CHECK(o.after);
        CHECK(same_bits(o.a, serial_sum(n, size)));
        std::vector<float> b = values(1, size + 3);
        for (int r = 1; r < n; ++r)
          for (int64_t i = 0; i < size + 3; ++i) b[size_t(i)] += value(r + 1, i);
        CHECK(same_bits(o.b, b));
        CHECK(o.blocking == n);
      }
    }
}

TEST_CASE("thread comm: a finished handle's number is reused, as MPI reuses requests", "[ranks]") {
  auto got = on_ranks(2, [&](Comm& c) {
    float x = 1;
    const int h = c.start_allreduce_sum(&x, 1);
    const int h_busy = c.start_allreduce_sum(&x, 0);
    c.wait(h);
    c.wait(h);  // waiting again on a finished handle returns at once
    const int again = c.start_allreduce_sum(&x, 1);
    c.wait(again);
    c.wait(h_busy);
    return std::vector<int>{h, h_busy, again, int(x)};
  });
  for (auto& v : got) CHECK(v == std::vector<int>{0, 1, 0, 4});
}

TEST_CASE("thread comm: host names, the side channel, watchdog marks", "[ranks]") {
  struct Out {
    std::string host, why;
    std::vector<std::string> hosts;
    bool channel = true;
    int32_t where_after_allreduce = 0, where_after_split_barrier = 0;
    uint64_t ticks = 0;
  };
  RanksOptions opt{.hosts = {"a", "b", "c"}};
  auto got = on_ranks(3, [&](Comm& c) {
    Out o;
    o.host = c.host();
    o.hosts = c.all_hosts();
    o.channel = c.open_side_channel(16, true, &o.why) != nullptr;
    Activity act;
    c.set_activity(&act);
    int64_t x = 1;
    c.allreduce_sum(&x, 1);
    o.where_after_allreduce = act.where.load();
    auto sub = c.split(0, 0);
    sub->barrier();  // a split marks its parent's activity
    o.where_after_split_barrier = act.where.load();
    o.ticks = act.ticks.load();
    c.set_activity(nullptr);
    return o;
  }, opt);
  for (int r = 0; r < 3; ++r) {
    CHECK(got[size_t(r)].host == opt.hosts[size_t(r)]);
    CHECK(got[size_t(r)].hosts == opt.hosts);
    CHECK_FALSE(got[size_t(r)].channel);
    CHECK(got[size_t(r)].why.find("no side channel") != std::string::npos);
    CHECK(got[size_t(r)].where_after_allreduce == -Activity::kAllreduce);
    CHECK(got[size_t(r)].where_after_split_barrier == -Activity::kBarrier);
    CHECK(got[size_t(r)].ticks == 4);  // enter and leave, twice
  }
  run_ranks(1, [](Comm& c) {
    std::string why;
    if (c.open_side_channel(16, true, &why) || why != "one rank" || c.host() != "thread-host")
      throw std::runtime_error("one rank: " + why + ", " + c.host());
  });
}

TEST_CASE("thread comm: ranks calling different collectives fail, naming both calls", "[ranks]") {
  try {
    run_ranks(3, [](Comm& c) {
      double x = 1;
      if (c.rank() == 2) c.broadcast(&x, 8, 0);
      else c.allreduce_sum(&x, 1);
    });
    FAIL("no error");
  } catch (const std::logic_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("collective mismatch"));
    CHECK_THAT(msg, Catch::Contains("broadcast(8 bytes, root 0)"));
    CHECK_THAT(msg, Catch::Contains("allreduce_sum(double, 1)"));
  }
  // Same call, other counts.
  CHECK_THROWS_WITH(run_ranks(2, [](Comm& c) {
                      float x[2] = {1, 2};
                      c.allreduce_sum(x, 1 + c.rank());
                    }),
                    Catch::Contains("allreduce_sum(float, 2)"));
  // A receive of another count than the send's.
  CHECK_THROWS_WITH(run_ranks(2, [](Comm& c) {
                      float x[3] = {};
                      c.wait(c.rank() == 0 ? c.start_send(x, 3, 1, 0) : c.start_recv(x, 2, 0, 0));
                    }),
                    Catch::Contains("a send of 3 floats met a receive of 2"));
}

TEST_CASE("thread comm: an exception in one rank wakes the others and is rethrown", "[ranks]") {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_ranks(4, [](Comm& c) {
                      if (c.rank() == 3) throw std::runtime_error("rank 3 broke");
                      c.barrier();  // never completes: rank 3 is gone
                    }),
                    "rank 3 broke");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not the timeout
}

TEST_CASE("thread comm: a deadlock fails after the timeout, saying where each rank waits", "[ranks]") {
  // Both ranks send first and wait for it: with rendezvous sends (MPI's, for large messages)
  // neither receive is ever posted.
  try {
    run_ranks(2, [](Comm& c) {
      float x = 0;
      c.wait(c.start_send(&x, 1, 1 - c.rank(), 3));
      c.wait(c.start_recv(&x, 1, 1 - c.rank(), 3));
    }, {.timeout_s = 0.3});
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("did not finish within 0.3 s"));
    CHECK_THAT(msg, Catch::Contains("rank 0: blocked in wait for a send of 1 floats to rank 1, tag 3"));
    CHECK_THAT(msg, Catch::Contains("rank 1: blocked in wait for a send of 1 floats to rank 0, tag 3"));
  }
  // A rank that returns early leaves the others in the collective.
  CHECK_THROWS_WITH(run_ranks(2, [](Comm& c) {
                      if (c.rank() == 0) c.barrier();
                    }, {.timeout_s = 0.3}),
                    Catch::Contains("rank 0: blocked in barrier()") && Catch::Contains("rank 1: finished"));
}

// Shards of unequal size, some empty: rank r's shard holds the rank-order sum of that shard
// (reduce-scatter), then every rank holds every owner's shard (all-gather): together the
// allreduce, bit for bit.
TEST_CASE("thread comm: reduce-scatter and all-gather of unequal shards make the allreduce", "[ranks]") {
  for (int n : kRanks)
    for (int64_t size : kSizes) {
      std::vector<int64_t> counts(size_t(n), 0);
      for (int r = 0; r < n; ++r) counts[size_t(r)] = size * (r + 1) / (n + 1) - size * r / (n + 1);
      counts[size_t(n - 1)] += size - std::accumulate(counts.begin(), counts.end(), int64_t(0));
      INFO(n << " ranks, " << size << " floats, last shard " << counts.back());
      struct Out {
        std::vector<float> scattered, gathered;
      };
      auto got = on_ranks(n, [&](Comm& c) {
        Out o;
        o.scattered = values(c.rank(), size);
        c.wait(c.start_reduce_scatter_sum(o.scattered.data(), counts));
        o.gathered = o.scattered;
        c.wait(c.start_allgather(o.gathered.data(), counts));
        return o;
      });
      const auto sum = serial_sum(n, size);
      int64_t at = 0;
      for (int r = 0; r < n; ++r) {
        const auto shard = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + at, v.begin() + at + counts[size_t(r)]);
        };
        CHECK(same_bits(shard(got[size_t(r)].scattered), shard(sum)));
        at += counts[size_t(r)];
      }
      for (auto& o : got) CHECK(same_bits(o.gathered, sum));
    }
}
