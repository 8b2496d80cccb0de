// The process grid (grid.h) on in-process ranks: every (P, T) that divides 1..4 ranks under
// both placements. Each communicator's members are found by summing one bit per world rank
// over it, and must be exactly the ranks grid.h says.
#include <catch2/catch.hpp>

#include <algorithm>

#include "ranks_util.h"
#include "strata/grid.h"

using namespace strata;
using namespace strata::test;

namespace {

struct Place {
  int stage, replica, tensor;
  int size[5], rank[5];   // stage, pipe, tensor, model, tied (0: none)
  int64_t members[5];     // bit w set: world rank w is in it
  int node_ranks;
};

int64_t members(Comm* c, int world_rank) {
  if (!c) return 0;
  int64_t bits = int64_t(1) << world_rank;
  c->allreduce_sum(&bits, 1);
  return bits;
}

}  // namespace

TEST_CASE("process grid: each group holds exactly its ranks, in order, under both placements", "[ranks]") {
  for (int n : {1, 2, 3, 4})
    for (int P = 1; P <= n; ++P)
      for (int T = 1; T <= n; ++T) {
        if (n % (P * T) != 0) continue;
        for (const std::string placement : {"replicas_in_node", "pipeline_in_node"}) {
          INFO(n << " ranks, P " << P << ", T " << T << ", " << placement);
          RanksOptions opt;
          for (int r = 0; r < n; ++r) opt.hosts.push_back("node" + std::to_string(r / 2));
          ProcessGrid shape;  // for world_rank(): the placement arithmetic under test
          shape.stages = P;
          shape.tensors = T;
          shape.replicas = n / (P * T);
          shape.placement = placement;
          auto got = on_ranks(n, [&](Comm& world) {
            ProcessGrid g = make_grid(world, P, T, placement, 1);
            Place p{g.stage, g.replica, g.tensor, {}, {}, {}, g.node_ranks};
            Comm* comms[5] = {g.stage_comm.get(), g.pipe_comm.get(), g.tensor_comm.get(),
                              g.model_comm.get(), g.tied_comm.get()};
            for (int k = 0; k < 5; ++k) {
              p.size[k] = comms[k] ? comms[k]->size() : 0;
              p.rank[k] = comms[k] ? comms[k]->rank() : -1;
            }
            // In the order of the splits: every rank joins the first four; the tied one only
            // its members.
            for (int k = 0; k < 5; ++k) p.members[k] = members(comms[k], world.rank());
            return p;
          }, opt);
          const int D = shape.replicas;
          for (int w = 0; w < n; ++w) {
            INFO("world rank " << w);
            const Place& p = got[size_t(w)];
            CHECK(shape.world_rank(p.stage, p.replica, p.tensor) == w);
            auto bits = [&](auto in) {
              int64_t b = 0;
              for (int s = 0; s < P; ++s)
                for (int r = 0; r < D; ++r)
                  for (int t = 0; t < T; ++t)
                    if (in(s, r, t)) b |= int64_t(1) << shape.world_rank(s, r, t);
              return b;
            };
            CHECK(p.members[0] == bits([&](int s, int, int t) { return s == p.stage && t == p.tensor; }));
            CHECK(p.members[1] == bits([&](int, int r, int t) { return r == p.replica && t == p.tensor; }));
            CHECK(p.members[2] == bits([&](int s, int r, int) { return s == p.stage && r == p.replica; }));
            CHECK(p.members[3] == bits([&](int, int r, int) { return r == p.replica; }));
            CHECK((p.size[0] == D && p.rank[0] == p.replica));
            CHECK((p.size[1] == P && p.rank[1] == p.stage));
            CHECK((p.size[2] == T && p.rank[2] == p.tensor));
            CHECK((p.size[3] == P * T && p.rank[3] == p.stage * T + p.tensor));
            const bool tied = P > 1 && (p.stage == 0 || p.stage == P - 1);
            CHECK(p.members[4] == (tied ? bits([&](int s, int r, int t) {
              return (s == 0 || s == P - 1) && r == p.replica && t == p.tensor;
            }) : 0));
            if (tied) CHECK(p.rank[4] == (p.stage == 0 ? 0 : 1));
            CHECK(p.node_ranks == std::min(2, n - w / 2 * 2));  // hosts: two ranks a node
          }
        }
      }
}
