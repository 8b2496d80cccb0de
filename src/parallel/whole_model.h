// The whole model from its pipeline stages, where something needs every layer at once: a
// checkpoint and the final parameter file (written by rank 0), a resume (read by rank 0).
//
// Stage s holds layers [first, last) and, in the whole model's flat buffers (reverse layer
// order), one contiguous block: the parameters of the layers after `last` come before it.
// Moving a stage is moving that block, and the same block of each optimizer state buffer.
// An interleaved stage holds v chunks: v blocks, side by side in its own buffers.
#pragma once
#include <vector>

#include "model/model.h"
#include "model/optim.h"
#include "parallel/grid.h"
#include "strata/comm.h"

namespace strata {

struct StageBlock {
  int64_t offset = 0, count = 0;  // in the whole model's flat buffers
};
StageBlock stage_block(const std::vector<LayerInfo>& layers, LayerRange r);

// Collective over `world`: copies every stage's parameters and optimizer state (from replica
// 0; with tensor parallelism, each stage's parts assembled into whole tensors by its part 0)
// into `whole` and `whole_opt` on world rank 0 (which is stage 0 of replica 0, part 0).
// Others may pass null for whole and whole_opt. with_state = false: the parameters only
// (the final parameter file; `opt` may then be a ZeRO shard).
// `ranges`: the virtual stages' (stage_chunks gives each stage's).
void gather_stages(Comm& world, const ProcessGrid& grid, const std::vector<LayerInfo>& layers,
                   const std::vector<LayerRange>& ranges, Model& stage, Optimizer& opt,
                   Model* whole, Optimizer* whole_opt, bool with_state = true);

// This rank's stage block (its tensor part of it) of a whole model and its optimizer state
// (after a resume), and the token table's copy if the stage has one.
void take_stage(Model& whole, Optimizer& whole_opt, Model& stage, Optimizer& opt);
// The same for the parameters alone (train.init_from: a model file without optimizer state).
void take_stage_params(Model& whole, Model& stage);

}  // namespace strata
