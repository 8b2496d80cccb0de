#include "parallel/whole_model.h"

#include <algorithm>

#include "strata/error.h"

namespace strata {
namespace {

void send(Comm& c, const float* p, int64_t n, int to) {
  int h = c.start_send(p, n, to, 0);
  c.wait(h);
}
void recv(Comm& c, float* p, int64_t n, int from) {
  int h = c.start_recv(p, n, from, 0);
  c.wait(h);
}

// The flat buffers a stage moves: parameters, then each optimizer state, in state() order.
std::vector<float*> buffers(Model& m, Optimizer& opt, bool with_state = true) {
  std::vector<float*> b = {m.host_values().data()};
  if (with_state)
    for (auto& [name, t] : opt.state()) b.push_back(t->data());
  return b;
}

}  // namespace

StageBlock stage_block(const std::vector<LayerInfo>& layers, LayerRange r) {
  StageBlock b;
  for (int i = 0; i < int(layers.size()); ++i) {
    if (i >= r.last) b.offset += layers[size_t(i)].flat;
    else if (i >= r.first) b.count += layers[size_t(i)].flat;
  }
  return b;
}

void gather_stages(Comm& world, const ProcessGrid& grid, const std::vector<LayerInfo>& layers,
                   const std::vector<LayerRange>& ranges, Model& stage, Optimizer& opt,
                   Model* whole, Optimizer* whole_opt, bool with_state) {
  const bool root = world.rank() == 0;
  if (root) {
    STRATA_CHECK(whole && whole_opt, "rank 0 gathers into a whole model");
    whole_opt->set_steps_taken(opt.steps_taken());
  }
  if (grid.replica != 0 && !root) return;
  STRATA_CHECK(!with_state || !opt.sharded(), "a ZeRO shard is gathered with zero.h first");
  auto mine = buffers(stage, opt, with_state);
  // Tensor parallelism: part 0 of each stage assembles the stage's unsplit block first.
  std::vector<std::vector<float>> assembled;
  if (grid.tensors > 1) {
    Comm& tc = *grid.tensor_comm;
    if (grid.tensor != 0) {
      for (float* p : mine) send(tc, p, stage.layout().block_params(), 0);
      return;
    }
    std::vector<std::vector<float>> parts(size_t(grid.tensors - 1), std::vector<float>(size_t(stage.layout().block_params())));
    for (float*& p : mine) {
      std::vector<const float*> from = {p};
      for (int t = 1; t < grid.tensors; ++t) {
        recv(tc, parts[size_t(t - 1)].data(), stage.layout().block_params(), t);
        from.push_back(parts[size_t(t - 1)].data());
      }
      assembled.emplace_back(size_t(stage.layout().whole_block_params()));
      stage.layout().assemble(from, assembled.back().data());
      p = assembled.back().data();
    }
  }
  if (!root) {
    for (float* p : mine) send(world, p, stage.layout().whole_block_params(), 0);
    return;
  }
  auto dst = buffers(*whole, *whole_opt, with_state);
  std::vector<float> got;
  for (int s = 0; s < grid.stages; ++s) {
    // The stage's block: its chunks' blocks, the later chunk first (one without interleaving).
    std::vector<StageBlock> blocks;
    int64_t total = 0;
    const auto chunks = stage_chunks(ranges, grid.stages, s);
    for (size_t c = chunks.size(); c-- > 0;) {
      blocks.push_back(stage_block(layers, chunks[c]));
      total += blocks.back().count;
    }
    for (size_t k = 0; k < dst.size(); ++k) {
      const float* from = mine[k];
      if (s != grid.stage && blocks.size() == 1) {  // straight into place
        recv(world, dst[k] + blocks[0].offset, total, grid.world_rank(s, 0));
        continue;
      }
      if (s != grid.stage) {
        got.resize(size_t(total));
        recv(world, got.data(), total, grid.world_rank(s, 0));
        from = got.data();
      }
      for (const StageBlock& b : blocks) {
        std::copy_n(from, b.count, dst[k] + b.offset);
        from += b.count;
      }
    }
  }
}

namespace {

// take_stage, and with null optimizers its parameters-only form.
void take(Model& whole, Optimizer* whole_opt, Model& stage, Optimizer* opt) {
  std::vector<float*> src = {whole.host_values().data()}, dst = {stage.host_values().data()};
  if (whole_opt) {
    src = buffers(whole, *whole_opt);
    dst = buffers(stage, *opt);
  }
  const auto& segments = stage.partition().segments();
  std::vector<float> block;  // the stage's chunks' blocks side by side (interleaved pipelines)
  if (segments.size() > 1) block.resize(size_t(stage.layout().whole_block_params()));
  // The token table's copy on the head's stage: the table's values and state.
  const Param* copy = stage.tied().copy();
  const Param* table = stage.tied().source_in(whole.params());
  for (size_t k = 0; k < src.size(); ++k) {
    const float* from = src[k] + segments[0].whole_offset;
    if (segments.size() > 1) {
      for (const Segment& g : segments)
        std::copy_n(src[k] + g.whole_offset, g.count, block.data() + g.block_offset);
      from = block.data();
    }
    stage.layout().extract(from, dst[k]);
    if (table) std::copy_n(src[k] + table->offset, numel(table->shape), dst[k] + copy->offset);
  }
  if (opt) opt->set_steps_taken(whole_opt->steps_taken());
}

}  // namespace

void take_stage(Model& whole, Optimizer& whole_opt, Model& stage, Optimizer& opt) {
  take(whole, &whole_opt, stage, &opt);
}

void take_stage_params(Model& whole, Model& stage) { take(whole, nullptr, stage, nullptr); }

}  // namespace strata
