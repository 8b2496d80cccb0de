#include "parallel/zero.h"

#include <algorithm>

#include "strata/error.h"

namespace strata {

std::vector<int64_t> zero_counts(const Model& model, int replicas) {
  return model.layout().flat_counts(cache_line_shards(model.layout().packed_params(), replicas));
}

OptimShard zero_shard(const std::vector<int64_t>& counts, int replica) {
  OptimShard s;
  for (int r = 0; r < replica; ++r) s.begin += counts[size_t(r)];
  s.end = s.begin + counts[size_t(replica)];
  return s;
}

std::vector<int64_t> shard_parts(const std::vector<int64_t>& counts, int64_t begin, int64_t end) {
  std::vector<int64_t> parts;
  int64_t s0 = 0;
  for (int64_t c : counts) {
    parts.push_back(std::max<int64_t>(0, std::min(s0 + c, end) - std::max(s0, begin)));
    s0 += c;
  }
  return parts;
}

std::unique_ptr<Optimizer> gather_shards(Comm& world, const ProcessGrid& grid, Optimizer& opt,
                                         const std::vector<int64_t>& counts) {
  constexpr int kTag = 71;  // apart from the pipeline's tags
  const int root = grid.world_rank(grid.stage, 0, grid.tensor);
  auto mine = opt.state();
  if (grid.replica != 0) {
    const OptimShard s = opt.shard();
    const int64_t lead = s.begin - opt.state_base();
    for (auto& [name, t] : mine)
      world.wait(world.start_send(t->data() + lead, s.end - s.begin, root, kTag));
    return nullptr;
  }
  auto whole = std::make_unique<Optimizer>(opt.config(), opt.num_params());
  whole->set_steps_taken(opt.steps_taken());
  auto dst = whole->state();
  for (size_t k = 0; k < dst.size(); ++k) {
    // Replica 0's shard begins at 0: its state buffer is the shard's, no lead.
    std::copy_n(mine[k].second->data(), opt.shard().end, dst[k].second->data());
    for (int r = 1; r < grid.replicas; ++r) {
      const OptimShard s = zero_shard(counts, r);
      world.wait(world.start_recv(dst[k].second->data() + s.begin, s.end - s.begin,
                                  grid.world_rank(grid.stage, r, grid.tensor), kTag));
    }
  }
  return whole;
}

void take_shard(Optimizer& whole, Optimizer& opt) {
  STRATA_CHECK(whole.num_params() == opt.num_params() && !whole.sharded(),
               "a shard is taken from the whole state of the same buffer");
  auto src = whole.state(), dst = opt.state();
  const int64_t base = opt.state_base();
  for (size_t k = 0; k < src.size(); ++k)
    std::copy_n(src[k].second->data() + base, dst[k].second->size(), dst[k].second->data());
  opt.set_steps_taken(whole.steps_taken());
}

void allgather_shards(Comm& stage_comm, float* values, const std::vector<int64_t>& counts,
                      TrafficGate* gate) {
  constexpr int64_t kPiece = int64_t(1) << 28;
  const GateClosed closed(gate);
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  std::vector<int> handles;
  for (int64_t p0 = 0; p0 < n; p0 += kPiece)
    handles.push_back(stage_comm.start_allgather(
        values + p0, shard_parts(counts, p0, std::min(n, p0 + kPiece))));
  for (int h : handles) stage_comm.wait(h);
}

}  // namespace strata
