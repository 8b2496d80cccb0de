// The process grid (grid.h) on in-process ranks: every (P, T) that divides 1..4 ranks under
// both placements. Each communicator's members are found by summing one bit per world rank
// over it, and must be exactly the ranks grid.h says.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "base/job.h"
#include "parallel/grid.h"
#include "ranks_util.h"
#include "run/run_plan.h"

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

// Rank -> GPU: the launcher's node-local rank before an inherited SLURM_LOCALID (mpirun inside
// an allocation gives every rank the batch step's SLURM_LOCALID 0), and ranks that share a GPU
// named at start-up.
TEST_CASE("node-local rank: mpirun's or Hydra's before an inherited SLURM_LOCALID", "[ranks]") {
  const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* s = std::getenv(v)) saved.emplace_back(v, s);
    ::unsetenv(v);
  }
  CHECK(node_local_rank().rank == 0);
  CHECK(std::string(node_local_rank().source) == "launched alone");
  ::setenv("SLURM_LOCALID", "0", 1);
  CHECK(node_local_rank().rank == 0);
  CHECK(std::string(node_local_rank().source) == "SLURM_LOCALID");
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  CHECK(node_local_rank().rank == 3);
  CHECK(std::string(node_local_rank().source) == "OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::setenv("MPI_LOCALRANKID", "2", 1);
  CHECK(node_local_rank().rank == 2);
  for (const char* v : vars) ::unsetenv(v);
  for (auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("shared GPUs: ranks on one host that took the same GPU are named", "[ranks]") {
  // In-process ranks share one host name: GPU r % 2 of 4 ranks, then every rank on GPU 0.
  auto two = on_ranks(4, [](Comm& c) { return shared_gpus(c, c.rank() % 2); });
  CHECK(two[0] == "ranks 0, 2 share GPU 0 of host " + two[0].substr(two[0].rfind(' ') + 1) +
                      "; ranks 1, 3 share GPU 1 of host " + two[0].substr(two[0].rfind(' ') + 1));
  auto one = on_ranks(2, [](Comm& c) { return shared_gpus(c, 0); });
  CHECK(one[0].rfind("ranks 0, 1 share GPU 0 of host ", 0) == 0);
  auto own = on_ranks(2, [](Comm& c) { return shared_gpus(c, c.rank()); });
  CHECK(own[0].empty());
  auto cpu = on_ranks(2, [](Comm& c) { return shared_gpus(c, -1); });
  CHECK(cpu[0].empty());
}
