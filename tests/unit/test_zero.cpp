// ZeRO's pieces (zero.h): the shard layout, a sharded optimizer's update and clipping against
// the unsharded one (bitwise), and the shards' round trip through a checkpoint's unsharded
// state (gather_shards, take_shard) on in-process ranks.
#include <catch2/catch.hpp>

#include <cmath>

#include "parallel/grid.h"
#include "parallel/zero.h"
#include "ranks_util.h"

using namespace strata;
using namespace strata::test;

TEST_CASE("zero_counts: contiguous shards of whole cache lines that tile the buffer", "[unit]") {
  for (int64_t n : {0, 1, 15, 16, 17, 100, 1000, 4099})
    for (int d : {1, 2, 3, 4, 7}) {
      INFO(n << " floats over " << d);
      const auto c = cache_line_shards(n, d);
      REQUIRE(int(c.size()) == d);
      int64_t sum = 0;
      for (int r = 0; r < d; ++r) {
        CHECK(c[size_t(r)] >= 0);
        // No shard more than a cache line over an even split.
        CHECK(c[size_t(r)] <= n / d + 16);
        const OptimShard s = zero_shard(c, r);
        CHECK(s.begin == sum);
        CHECK((s.begin % 16 == 0 || s.begin == n));  // shards start on a cache line
        sum += c[size_t(r)];
        CHECK(s.end == sum);
      }
      CHECK(sum == n);
    }
}

TEST_CASE("sharded(): given a shard, whatever its extent, the same on every replica", "[unit]") {
  const OptimConfig c{.kind = "adamw"};
  for (int64_t n : {0, 10, 100}) {
    const auto counts = cache_line_shards(n, 2);  // 10 floats: [10, 0]; none: [0, 0]
    for (int r = 0; r < 2; ++r) CHECK(Optimizer(c, n, zero_shard(counts, r)).sharded());
    CHECK_FALSE(Optimizer(c, n).sharded());
  }
}

namespace {
// A fixed, non-trivial buffer.
std::vector<float> values(int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i * 3 + salt)) * 0.5f;
  return v;
}
}  // namespace

TEST_CASE("sharded optimizer: each shard's update and clipping are the unsharded one's, bitwise", "[ranks]") {
  const int64_t n = 203;
  const Backend& be = cpu_backend();
  for (const char* kind : {"adamw", "sgd"})
    for (double clip : {0.0, 0.1}) {
      INFO(kind << ", grad_clip " << clip);
      const OptimConfig c{.kind = kind, .lr = 0.01, .weight_decay = 0.01, .grad_clip = clip};
      // Unsharded: three steps.
      Tensor p({n}), g({n});
      std::vector<double> norms;
      Optimizer whole(c, n);
      for (int s = 0; s < 3; ++s) {
        auto pv = s == 0 ? values(n, 1) : std::vector<float>(p.data(), p.data() + n);
        std::copy(pv.begin(), pv.end(), p.data());
        const auto gv = values(n, 10 + s);
        std::copy(gv.begin(), gv.end(), g.data());
        norms.push_back(whole.step(be, p, g, s));
      }
      const std::vector<float> want(p.data(), p.data() + n);
      for (int d : {2, 3}) {
        INFO(d << " shards");
        auto got = on_ranks(d, [&](Comm& comm) {
          Tensor q({n}), h({n});
          const auto cv = values(n, 1);
          std::copy(cv.begin(), cv.end(), q.data());
          const auto counts = cache_line_shards(n, d);
          Optimizer mine(c, n, zero_shard(counts, comm.rank()));
          std::vector<double> seen;
          for (int s = 0; s < 3; ++s) {
            const auto gv = values(n, 10 + s);
            std::copy(gv.begin(), gv.end(), h.data());
            seen.push_back(mine.step(be, q, h, s, nullptr, nullptr, &comm));
            allgather_shards(comm, q.data(), counts);
          }
          return std::pair{std::vector<float>(q.data(), q.data() + n), seen};
        });
        for (int r = 0; r < d; ++r) {
          CHECK(same_bits(got[size_t(r)].first, want));
          for (int s = 0; s < 3; ++s)
            CHECK(std::abs(got[size_t(r)].second[size_t(s)] - norms[size_t(s)]) <= 1e-12 * std::max(1.0, norms[size_t(s)]));
        }
      }
    }
}

TEST_CASE("ZeRO shards: gathered into the unsharded state and taken back, unchanged", "[ranks]") {
  const int64_t n = 150;
  const OptimConfig c{.kind = "adamw"};
  for (int d : {2, 3}) {
    INFO(d << " replicas");
    auto got = on_ranks(d, [&](Comm& world) {
      ProcessGrid grid = make_grid(world, 1, 1, "replicas_in_node", 1);
      const auto counts = cache_line_shards(n, d);
      Optimizer mine(c, n, zero_shard(counts, grid.replica));
      for (auto& [name, t] : mine.state())
        for (int64_t i = 0; i < t->size(); ++i)
          t->data()[i] = float(mine.state_base() + i) + (name == "exp_avg" ? 0.25f : 0.5f);
      mine.set_steps_taken(7);
      auto whole = gather_shards(world, grid, mine, counts);
      std::vector<float> flat;
      int64_t steps = -1;
      if (whole) {
        steps = whole->steps_taken();
        for (auto& [name, t] : whole->state()) flat.insert(flat.end(), t->data(), t->data() + t->size());
      }
      // Back: every rank takes its shard of replica 0's whole state (as a resume does).
      Optimizer full(c, n);
      if (whole) full = *whole;
      for (auto& [name, t] : full.state()) world.broadcast(t->data(), t->size() * 4, 0);
      Optimizer back(c, n, zero_shard(counts, grid.replica));
      full.set_steps_taken(7);
      take_shard(full, back);
      bool same = back.steps_taken() == 7;
      auto a = back.state(), b = mine.state();
      for (size_t k = 0; k < a.size(); ++k)
        for (int64_t i = 0; i < a[k].second->size(); ++i)
          same = same && a[k].second->data()[i] == b[k].second->data()[i];
      return std::tuple{flat, steps, int(same)};
    });
    std::vector<float> want;
    for (float off : {0.25f, 0.5f})
      for (int64_t i = 0; i < n; ++i) want.push_back(float(i) + off);
    CHECK(same_bits(std::get<0>(got[0]), want));
    CHECK(std::get<1>(got[0]) == 7);
    for (int r = 0; r < d; ++r) {
      CHECK(std::get<2>(got[size_t(r)]) == 1);
      if (r > 0) CHECK(std::get<0>(got[size_t(r)]).empty());
    }
  }
}
